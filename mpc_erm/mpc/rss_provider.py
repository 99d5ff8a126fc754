"""Correlated randomness for 3-party replicated sharing, made by the parties themselves: no dealer.

CrypTen 0.4.1's replicated protocol covers arithmetic products only; every binary AND (and so every
comparison and the noise samplers' coins) and every B2A conversion still asks the tuple provider
for binary triples and random bits (docs/crypten-findings.md #3). Without a dealer that provider
would be TFP, where party 0 sees everything. :class:`ReplicatedProvider` produces those tuples
with ABY3's semi-honest 3-party protocols (Mohassel–Rindal, CCS 2018, §3.2 and §5.3), secure
against any single corrupt party (honest majority), which is exactly the RSS trust model:

- **binary triple** (a, b, c = a ∧ b), with no message: component a_i of a = ⊕ a_i is drawn from
  the generator that parties i and i+1 share (CrypTen's "next" at party i, "prev" at party i+1:
  the pairwise seeds its zero sharings use), so each party holds two of the three components and
  none holds a third — a replicated sharing made without sending anything (ABY3 §2.2, shared
  random values); b likewise. Party i keeps z_i = a_i b_i ⊕ a_i b_{i-1} ⊕ a_{i-1} b_i ⊕ α_i with α
  a pseudo-random XOR sharing of zero; ⊕_i z_i = (⊕a_i)(⊕b_i), the three cross pairs once each.
  The zero sharing is what stops z_i from revealing a cross term. (Until issue 15 each party drew
  a_i, b_i locally and sent them to its neighbour: 2 words per AND word, more than the opening.)
- **B2A bit** (the same random bit r as an arithmetic and a binary sharing): party i draws a bit
  r_i (its XOR share); the arithmetic sharing of r = r_0 ⊕ r_1 ⊕ r_2 is computed with two hardened
  RSS products, u = r_0 + r_1 − 2 r_0 r_1, r = u + r_2 − 2 u r_2, from arithmetic sharings of each
  r_i re-randomised with a zero sharing first (a bare [r_i, 0, 0] would show r_i to the neighbour
  that receives the replicated share).
- **arithmetic triple / square**: random a, b and one hardened RSS product (not used by CrypTen's
  replicated protocol itself, which multiplies without triples; provided for completeness).
- ``wrap_rng`` is for the 2-out-of-n truncation, which replicated sharing replaces: refused.

Every party must make the same calls in the same order (the zero sharings' generators advance in
step), as with every CrypTen protocol.
"""

from __future__ import annotations

from typing import Any

import torch

from .crypten_compat import import_crypten
from .tuple_pool import B2A_POOL_BITS, DevicePools, FlatPool

crypten = import_crypten()
from crypten.common.rng import generate_kbit_random_tensor, generate_random_ring_element  # noqa: E402
from crypten.config import cfg  # noqa: E402
from crypten.mpc.primitives import ArithmeticSharedTensor, BinarySharedTensor, replicated  # noqa: E402
from crypten.mpc.provider.provider import TupleProvider  # noqa: E402

__all__ = ["PROVIDER_NAME", "ReplicatedProvider", "start_replicated_provider"]

PROVIDER_NAME = "RSS3"


def _device(device: Any) -> torch.device:
    return torch.device("cpu") if device is None else torch.device(device)


def _local() -> dict[torch.device, torch.Generator]:
    return crypten.generators["local"]


def _check_three() -> None:
    world = crypten.communicator.get().get_world_size()
    if world != 3:
        raise RuntimeError(f"trust: replicated sharing is for exactly 3 parties (this session has {world})")
    from .dealer import rss_hardened

    if not rss_hardened():
        raise RuntimeError("ReplicatedProvider needs harden_crypten_rss() first (the products' zero sharing)")


def _fresh_arithmetic(size: Any, device: torch.device) -> ArithmeticSharedTensor:
    """A uniformly random ring element, secret-shared: each party's share from its own generator."""
    share = generate_random_ring_element(size, generator=_local()[device], device=device)
    return ArithmeticSharedTensor.from_shares(share, precision=0)


def _own_bit_shared(bits: torch.Tensor, owner: int) -> ArithmeticSharedTensor:
    """Arithmetic sharing of party ``owner``'s private bits, re-randomised by a zero sharing."""
    rank = crypten.communicator.get().get_rank()
    base = bits if rank == owner else torch.zeros_like(bits)
    zero = ArithmeticSharedTensor.PRZS(bits.size(), device=bits.device).share
    return ArithmeticSharedTensor.from_shares(base + zero, precision=0)


def _binary_triple(size0: torch.Size, dev: torch.device, size1: torch.Size | None = None) -> tuple[torch.Tensor, ...]:
    """This party's XOR shares of a fresh binary triple, made without a message (module docstring):
    its own components a_i, b_i from the generator shared with the next party, its neighbour's
    a_{i-1}, b_{i-1} from the one shared with the previous party."""
    ahead, behind = crypten.generators["next"][dev], crypten.generators["prev"][dev]
    size1 = size0 if size1 is None else size1
    a1 = generate_kbit_random_tensor(size0, generator=ahead, device=dev)
    a2 = generate_kbit_random_tensor(size0, generator=behind, device=dev)
    b1 = generate_kbit_random_tensor(size1, generator=ahead, device=dev)
    b2 = generate_kbit_random_tensor(size1, generator=behind, device=dev)
    c = (a1 & b1) ^ (a1 & b2) ^ (a2 & b1)
    c = c ^ BinarySharedTensor.PRZS(c.size(), device=dev).share
    return a1, b1, c


def _random_bits(size: torch.Size, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """This party's arithmetic and XOR shares of fresh random bits (two RSS products; module docstring)."""
    r_b = generate_kbit_random_tensor(size, bitlength=1, generator=_local()[dev], device=dev)
    r0, r1, r2 = (_own_bit_shared(r_b, i) for i in range(3))
    u = r0 + r1 - 2 * r0.mul(r1)
    r_a = u + r2 - 2 * u.mul(r2)
    return r_a.share, r_b


class ReplicatedProvider(TupleProvider):
    """CrypTen ``TupleProvider`` for ``cfg.mpc.protocol = "replicated"`` with 3 parties, no dealer."""

    NAME = PROVIDER_NAME

    def __init__(self) -> None:
        super().__init__()
        self._binary = DevicePools(lambda dev: FlatPool(lambda n: _binary_triple(torch.Size([n]), dev)))
        self._b2a = DevicePools(lambda dev: FlatPool(lambda n: _random_bits(torch.Size([n]), dev), B2A_POOL_BITS))
        self.binary_words = 0  # words of binary triples handed out (64 AND gates each): benchmarks

    def reset(self) -> None:
        """Forget pooled tuples (a new session: new generators, new parties)."""
        self._binary.clear()
        self._b2a.clear()

    def generate_binary_triple(self, size0: Any, size1: Any, device: Any = None):
        """Triples of equal shapes are cut from a pool of :data:`~.tuple_pool.POOL_WORDS` words
        (:mod:`.tuple_pool`): fewer, larger PRG draws."""
        _check_three()
        dev = _device(device)
        size0, size1 = torch.Size(size0), torch.Size(size1)
        self.binary_words += max(size0.numel(), size1.numel())
        if size0 == size1:
            return tuple(BinarySharedTensor.from_shares(t) for t in self._binary.take(dev, size0))
        return tuple(BinarySharedTensor.from_shares(t) for t in _binary_triple(size0, dev, size1))

    def B2A_rng(self, size: Any, device: Any = None):
        """Cut from a pool of :data:`~.tuple_pool.B2A_POOL_BITS` bits (two RSS products per pool,
        not per call: the samplers convert bits in chunks)."""
        _check_three()
        r_a, r_b = self._b2a.take(_device(device), torch.Size(size))
        return ArithmeticSharedTensor.from_shares(r_a, precision=0), BinarySharedTensor.from_shares(r_b)

    def generate_additive_triple(self, size0: Any, size1: Any, op: str, device: Any = None, *args: Any,
                                 **kwargs: Any):
        _check_three()
        dev = _device(device)
        a, b = _fresh_arithmetic(size0, dev), _fresh_arithmetic(size1, dev)
        c = getattr(replicated, op)(a, b, *args, **kwargs)
        return a, b, c

    def square(self, size: Any, device: Any = None):
        _check_three()
        r = _fresh_arithmetic(size, _device(device))
        return r, replicated.square(r)

    def wrap_rng(self, size: Any, device: Any = None):
        raise RuntimeError("wrap_rng: the additive-sharing truncation is not used under replicated sharing "
                           "(CrypTen truncates RSS products with its 3-party protocol)")


def start_replicated_provider() -> ReplicatedProvider:
    """In each of the 3 parties, after ``init_crypten``: replicated protocol, hardened products, and
    this provider for binary triples and B2A bits. Idempotent."""
    from .dealer import harden_crypten_rss

    providers: dict[str, Any] = vars(crypten.mpc)["__SUPPORTED_PROVIDERS"]
    prov = providers.get(PROVIDER_NAME)
    if not isinstance(prov, ReplicatedProvider):
        prov = ReplicatedProvider()
        providers[PROVIDER_NAME] = prov
    prov.reset()
    harden_crypten_rss()
    cfg.mpc.protocol = "replicated"
    cfg.mpc.provider = PROVIDER_NAME
    _check_three()
    return prov
