"""The AES-256-CTR keystreams behind pairwise masks and replicated sharing's pair randomness,
checked against the AES-CTR keystream computed independently (one `cryptography` call)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from mpc_erm.mpc.keystream import KEY_BYTES, KeyedMasks, Keystream, new_key


def _reference(key: bytes, counter: int, nbytes: int) -> np.ndarray:
    """AES-256-CTR keystream from the 128-bit initial counter block ``counter``."""
    enc = Cipher(algorithms.AES(key), modes.CTR(counter.to_bytes(16, "big"))).encryptor()
    return np.frombuffer(enc.update(bytes(nbytes)) + enc.finalize(), dtype=np.int64)


def test_a_continuing_stream_is_aes_ctr_and_two_holders_agree() -> None:
    key = new_key()
    a, b = Keystream(key), Keystream(key)
    sizes = [(5,), (3, 4), (1000,), (0,), (7,)]
    got = [a.words(s) for s in sizes]
    assert [tuple(t.shape) for t in got] == sizes
    flat = np.concatenate([t.reshape(-1).numpy() for t in got])
    assert np.array_equal(flat, _reference(key, 0, 8 * flat.size))
    assert all(torch.equal(x, b.words(s)) for x, s in zip(got, sizes))  # same calls, same words
    assert not torch.equal(Keystream(new_key()).words((64,)), Keystream(key).words((64,)))


def test_words_are_fresh_tensors_and_bits_are_balanced() -> None:
    s = Keystream(new_key())
    x = s.words((1 << 16,))
    y = s.words((1 << 16,))
    x_before = x.clone()
    assert torch.equal(x, x_before) and not torch.equal(x, y)  # the second draw did not overwrite the first
    bits = ((x.unsqueeze(1) >> torch.arange(64)) & 1).double().mean(0)
    assert (bits - 0.5).abs().max() < 0.01  # 65,536 draws per bit: 5σ ≈ 0.01


def test_keyed_masks_match_aes_ctr_per_nonce() -> None:
    key = new_key()
    masks = KeyedMasks()
    for nonce, n in [(0, 10), (1, 100_000), (2**63 + 5, 3)]:
        assert np.array_equal(masks.words(key, nonce, n).numpy(), _reference(key, nonce << 64, 8 * n))


def test_masks_of_consecutive_nonces_share_no_word() -> None:
    """The aggregator draws round t's masks with nonce t: were the streams of t and t+1 to overlap
    (a counter block starting at the nonce itself did: t+1's stream was t's shifted by one block),
    a party that sees another's masked share in two rounds would learn differences of that
    party's coordinates across rounds. Each nonce owns its own 2^64 blocks."""
    key = new_key()
    masks = KeyedMasks()
    n = 4096
    streams = [set(masks.words(key, t, n).tolist()) for t in range(4)]
    for a in range(4):
        for b in range(a + 1, 4):
            assert not streams[a] & streams[b], (a, b)  # 2^-52 chance of one shared word by accident
    with pytest.raises(ValueError, match="nonce"):
        masks.words(key, 1 << 64, 1)


def test_a_key_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match=f"{KEY_BYTES} bytes"):
        Keystream(b"short")
