"""XOR-shared 64-lane words: the bit layer of the in-MPC samplers.

A shared bit vector is held as int64 words, 64 samples a word (lane l of word w is element
w·64 + l), each party holding an XOR share. Everything here works on whole words:

* :func:`local_words` / :func:`public_words`: exactly uniform words from this party's private
  generator (an XOR share of jointly random bits: uniform as long as one party's words are) or
  from CrypTen's ``global`` generator (public to the computing parties, not to the dealer);
* :func:`open_words`: reveal an XOR-shared tensor (one all-reduce);
* :func:`and_many` / :func:`and_words`: Beaver ANDs on whole words, every independent AND of a
  round in one triple request and one opening (or the replicated provider's native AND);
  :func:`public_xor`: XOR a public value in (rank 0 only);
* :func:`pack` / :func:`unpack`: bits ↔ words (local; works on shares and public words alike);
* :func:`b2a_bits`: arithmetic shares of XOR-shared bits (CrypTen's single-bit B2A, opened
  packed 64 bits per word).

:mod:`.coins` builds the biased coins on these, :mod:`.discrete_laplace` and
:mod:`.discrete_gaussian` their samplers. Nothing here logs or returns plaintext noise.
"""

from __future__ import annotations

import numpy as np
import torch

from ..crypten_compat import import_crypten, plain

crypten = import_crypten()

__all__ = ["B2A_CHUNK", "LANES", "and_many", "and_words", "b2a_bits", "local_words", "open_words", "pack", "party_rank",
           "public_words", "public_xor", "unpack"]

LANES = 64
_LANE_SHIFTS = torch.arange(LANES, dtype=torch.long)
_BXOR = torch.distributed.ReduceOp.BXOR
_INT64_MIN = -(1 << 63)
B2A_CHUNK = 1 << 19  # bits converted at a time: bounds the int64 temporaries (≈ 5 × 4 MiB)


def party_rank() -> int:
    """This party's rank in the CrypTen communicator (rank 0 applies public constants)."""
    return crypten.communicator.get().get_rank()


def local_words(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Exactly uniform int64 words from this party's private generator (one random64() each)."""
    g = crypten.generators["local"][device]
    return torch.empty(shape, dtype=torch.long, device=device).random_(_INT64_MIN, None, generator=g)


def public_words(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Exactly uniform int64 words that every party draws identically from CrypTen's ``global``
    generator (its seed is shared by the computing parties only: the dealer does not take part
    in CrypTen's seed set-up, rank ≥ world size)."""
    g = crypten.generators["global"][device]
    return torch.empty(shape, dtype=torch.long, device=device).random_(_INT64_MIN, None, generator=g)


def and_many(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """XOR shares of x ∧ y for every (x, y) in ``pairs``: independent ANDs of one round with ONE
    binary triple from the provider and ONE opening (CrypTen's ``beaver.AND`` per pair would make
    one provider request and one all-reduce each).

    Beaver: open ε = x ⊕ a, δ = y ⊕ b; party p keeps c_p ⊕ (ε ∧ y_p) ⊕ (a_p ∧ δ), whose XOR over
    the parties is ab ⊕ ε(δ ⊕ b) ⊕ aδ = (ε ⊕ a)(δ ⊕ b) = x ∧ y. Same openings as CrypTen's AND.
    """
    if not pairs:
        return []
    shapes = []
    xs, ys = [], []
    for x, y in pairs:
        x, y = torch.broadcast_tensors(x, y)
        shapes.append(x.shape)
        xs.append(x.reshape(-1))
        ys.append(y.reshape(-1))
    x = xs[0] if len(xs) == 1 else torch.cat(xs)
    y = ys[0] if len(ys) == 1 else torch.cat(ys)
    provider = crypten.mpc.get_default_provider()
    native = getattr(provider, "and_shares", None)
    if native is not None:  # replicated sharing: no triple, half the bytes (rss_provider)
        return _split(native(x, y), shapes)
    a, b, c = (plain(t.share) for t in provider.generate_binary_triple(x.size(), y.size(), device=x.device))
    m = x.numel()
    # ε and δ travel as ONE tensor: the transport's cost per message (not per byte) dominates
    # rounds of small and medium size.
    masked = torch.empty(2 * m, dtype=x.dtype, device=x.device)
    torch.bitwise_xor(x, a, out=masked[:m])
    torch.bitwise_xor(y, b, out=masked[m:])
    opened = open_words(masked)
    eps, delta = opened[:m], opened[m:]
    z = torch.bitwise_and(eps, y)
    z ^= c
    z ^= torch.bitwise_and(a, delta, out=a)  # a is ours (fresh from the provider)
    return _split(z, shapes)


def _split(z: torch.Tensor, shapes: list[torch.Size]) -> list[torch.Tensor]:
    """The flat result of :func:`and_many` cut back into its pairs' shapes."""
    if len(shapes) == 1:
        return [z.view(shapes[0])]
    out, off = [], 0
    for s in shapes:
        m = s.numel()
        out.append(z[off : off + m].view(s))
        off += m
    return out


def open_words(share: torch.Tensor) -> torch.Tensor:
    """Reveal an XOR-shared tensor to every party (one all-reduce)."""
    return crypten.communicator.get().all_reduce(share, op=_BXOR)


def and_words(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """XOR shares of x ∧ y (one Beaver AND round on whole words)."""
    return and_many([(x, y)])[0]


def public_xor(share: torch.Tensor, public: torch.Tensor | int) -> torch.Tensor:
    """XOR a public value into a shared one: only rank 0 applies it."""
    if party_rank() == 0:
        return share ^ public
    return share.clone() if isinstance(public, int) else share ^ torch.zeros_like(public)


def unpack(words: torch.Tensor, n: int) -> torch.Tensor:
    """(C, W) words → (C, n) bits (lane l of word w is element w·64 + l). Works on XOR shares
    and on public words alike."""
    if words.device.type == "cpu":
        return torch.from_numpy(_unpack_u8(words, n)).long()
    bits = (words.unsqueeze(-1) >> _LANE_SHIFTS.to(words.device)) & 1
    return bits.reshape(words.size(0), -1)[:, :n]


def _unpack_u8(words: torch.Tensor, n: int) -> np.ndarray:
    """(C, W) int64 words → (C, n) uint8 bits (CPU; little-endian lanes: lane l is bit l)."""
    raw = words.contiguous().numpy().view(np.uint8)  # (C, 8W): byte b of word w = bits 8b … 8b+7
    return np.unpackbits(raw, axis=-1, count=n, bitorder="little")


def pack(bits: torch.Tensor) -> torch.Tensor:
    """(C, n) bits (0/1, any integer dtype) → (C, W) words, the inverse of :func:`unpack`
    (zero-padded lanes)."""
    c, n = bits.shape
    w = -(-n // LANES)
    if bits.device.type == "cpu":
        b8 = bits.to(torch.uint8)
        if n != w * LANES:
            b8 = torch.nn.functional.pad(b8, (0, w * LANES - n))
        packed = np.packbits(b8.numpy(), axis=-1, bitorder="little")  # (C, 8W) uint8, contiguous
        return torch.from_numpy(packed.view(np.int64))
    padded = torch.zeros(c, w * LANES, dtype=torch.long, device=bits.device)
    padded[:, :n] = bits
    return (padded.reshape(c, w, LANES) << _LANE_SHIFTS.to(bits.device)).sum(-1)


def b2a_bits(words: torch.Tensor, n: int) -> torch.Tensor:
    """Arithmetic shares (C, n) of the bits held XOR-shared in ``words`` (C, W).

    CrypTen's single-bit B2A (the provider's random bit r as both arithmetic rA and binary rB;
    open x ⊕ r; x = rA + z − 2·z·rA), with x ⊕ r opened packed 64 per word. Rows are converted
    in chunks of about :data:`B2A_CHUNK` bits (a 2^17-sample Gaussian batch converts ≈ 4·10^6:
    one chunk would hold ≈ 150 MB of int64 temporaries per party).
    """
    rows = words.size(0)
    per = max(1, B2A_CHUNK // max(1, n))
    if rows > per:
        out = torch.empty((rows, n), dtype=torch.long, device=words.device)
        for i in range(0, rows, per):
            out[i : i + per] = b2a_bits(words[i : i + per], n)
        return out
    provider = crypten.mpc.get_default_provider()
    size = (words.size(0), n)
    r_a, r_b = provider.B2A_rng(torch.Size(size), device=words.device)
    # XOR share of the r bit: bit 0 of each party's share. Padding lanes (≥ n) carry r = 0 and so
    # open their x: those are coins of samples that do not exist, independent of every used one.
    masked = words ^ pack(plain(r_b.share) & 1)
    z = open_words(masked)
    # x = rA + z − 2·z·rA is rA where z = 0 and 1 − rA where z = 1. Per share, with m = −z (0 or
    # all ones): rA ⊕ m is rA or ¬rA = −rA − 1, so (rA ⊕ m) − m is rA or −rA; rank 0 then adds
    # z = −m once more.
    if words.device.type == "cpu":
        m = torch.from_numpy(_unpack_u8(z, n)).long().neg_()
    else:
        m = unpack(z, n).neg_()
    share = plain(r_a.share) ^ m
    share -= m
    if party_rank() == 0:
        share -= m
    return share
