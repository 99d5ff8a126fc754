"""AES-256-CTR keystreams as int64 words: the product's pseudo-random generator where two parties
must draw the same words (pairwise masks, replicated sharing's pair randomness).

Why not CrypTen's generators: they are torch's Mersenne twister, which is not a cryptographic
PRG (its state follows from 624 outputs), and its 64-bit draws cost 2.6 ns a word here (CrypTen's
ranged ring elements 5 ns) against ≈ 1.3–1.9 ns for AES-CTR with AES-NI. Words are written with
``update_into`` so that a keystream is one pass of AES over a reused zero buffer, not a chain of
copies (at 10⁶ words a fresh ``bytes`` keystream cost 13–46 ms in copies and page faults around
≈ 3 ms of AES).
"""

from __future__ import annotations

import math
import secrets

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes

__all__ = ["KEY_BYTES", "MAX_NONCE", "NONCE_SHIFT", "KeyedMasks", "Keystream", "new_key"]

KEY_BYTES = 32
_BLOCK = 16  # update_into wants room for one block more than it is given


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


class _Zeros:
    """A growing buffer of zero bytes to encrypt (CTR: ciphertext of zeros = the keystream)."""

    def __init__(self) -> None:
        self._buf = bytearray(0)

    def view(self, nbytes: int) -> memoryview:
        if len(self._buf) < nbytes:
            self._buf = bytearray(nbytes)
        return memoryview(self._buf)[:nbytes]


def _fill(enc: CipherContext, zeros: _Zeros, out: np.ndarray, nbytes: int) -> None:
    """Write the next ``nbytes`` of ``enc``'s keystream into ``out`` (≥ nbytes + one block)."""
    if enc.update_into(zeros.view(nbytes), out) != nbytes:
        raise RuntimeError("AES-CTR keystream of unexpected length")


class Keystream:
    """One continuing AES-256-CTR stream (nonce 0): both holders of the key draw the same words
    as long as they ask for the same sizes in the same order."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError(f"a keystream key has {KEY_BYTES} bytes, not {len(key)}")
        self._enc = Cipher(algorithms.AES(key), modes.CTR(bytes(_BLOCK))).encryptor()
        self._zeros = _Zeros()

    def words(self, size: torch.Size | tuple[int, ...], device: torch.device | str | None = None) -> torch.Tensor:
        """A fresh int64 tensor of ``size``, every word exactly uniform (one 64-bit block of keystream)."""
        n = math.prod(size)
        out = torch.empty(n + _BLOCK // 8, dtype=torch.long)
        _fill(self._enc, self._zeros, out.numpy().view(np.uint8), 8 * n)
        words = out[:n].view(size)
        return words if device is None or torch.device(device).type == "cpu" else words.to(device)


#: A nonce's stream starts at counter block nonce·2^64: each nonce owns 2^64 blocks, so the
#: streams of nonces t and t+1 never share a block. (Until 2026-11-27 the counter block started
#: at the nonce itself: round t+1's mask was round t's shifted by one block, so a party that saw
#: another's masked share in two rounds learned differences of its coordinates across rounds.)
NONCE_SHIFT = 64
MAX_NONCE = (1 << (128 - NONCE_SHIFT)) - 1


class KeyedMasks:
    """Keystreams keyed per call, (key, nonce) → n words, in one reused buffer: the aggregator's
    pairwise masks, a new nonce per round; different nonces give disjoint parts of the key's
    keystream (:data:`NONCE_SHIFT`)."""

    def __init__(self) -> None:
        self._zeros = _Zeros()
        self._out = np.empty(_BLOCK, dtype=np.uint8)

    def words(self, key: bytes, nonce: int, n: int) -> torch.Tensor:
        """n uniform int64 (a view of the buffer: valid until the next call)."""
        if not 0 <= nonce <= MAX_NONCE:
            raise ValueError(f"a mask nonce lies in [0, 2^{128 - NONCE_SHIFT}), got {nonce}")
        nbytes = 8 * n
        if nbytes > _BLOCK << NONCE_SHIFT:  # never: 2^68 bytes
            raise ValueError("a mask longer than one nonce's share of the keystream")
        if self._out.size < nbytes + _BLOCK:
            self._out = np.empty(nbytes + _BLOCK, dtype=np.uint8)
        counter = (nonce << NONCE_SHIFT).to_bytes(_BLOCK, "big")
        enc = Cipher(algorithms.AES(key), modes.CTR(counter)).encryptor()
        _fill(enc, self._zeros, self._out, nbytes)
        if enc.finalize():  # CTR is a stream mode: nothing is held back
            raise RuntimeError("AES-CTR keystream of unexpected length")
        return torch.from_numpy(self._out[:nbytes].view(np.int64))
