"""Correlated randomness for 3-party replicated sharing, made by the parties themselves: no dealer.

CrypTen 0.4.1's replicated protocol covers arithmetic products only; every binary AND (and so every
comparison and the noise samplers' coins) and every B2A conversion still asks the tuple provider
for binary triples and random bits (docs/explanation/crypten-findings.md #3). Without a dealer that provider
would be TFP, where party 0 sees everything. :class:`ReplicatedProvider` produces those tuples
with ABY3's semi-honest 3-party protocols (Mohassel–Rindal, CCS 2018, §3.2 and §5.3), secure
against any single corrupt party (honest majority), which is exactly the RSS trust model.

Pair randomness: parties i and i+1 share an AES-256-CTR keystream (:class:`PairStreams`; the key
drawn by party i from ``secrets`` at provider start and sent to i+1 over mTLS), not CrypTen's
pairwise Mersenne twisters, which are not cryptographic PRGs and cost 2–4× more per word (:mod:`.keystream`).

- **binary triple** (a, b, c = a ∧ b), with no message: component a_i of a = ⊕ a_i is drawn from
  the stream that parties i and i+1 share, so each party holds two of the three components and
  none holds a third — a replicated sharing made without sending anything (ABY3 §2.2, shared
  random values); b likewise. Party i keeps z_i = a_i b_i ⊕ a_i b_{i-1} ⊕ a_{i-1} b_i ⊕ α_i with α
  a pseudo-random XOR sharing of zero; ⊕_i z_i = (⊕a_i)(⊕b_i), the three cross pairs once each.
  The zero sharing is what stops z_i from revealing a cross term. (Drawing a_i, b_i locally and
  sending them to the neighbour would cost 2 words per AND word, more than the opening.)
- **B2A bit** (the same random bit r as an arithmetic and a binary sharing), one message of one
  word per bit from one party to one other (:func:`_random_bits`): r = c_0 ⊕ c_1 ⊕ c_2 with c_i
  drawn from the stream of the pair (i, i+1), so party i knows c_i and c_{i−1}, not c_{i+1}.
  Party A knows u = c_{A−1} ⊕ c_A; parties B = A+1 and C = A−1 both know c_B. Then r = u + c_B −
  2 u c_B over the ring, and the one product needs one masked word: A sends m = u + s to B, with
  s from the stream A shares with C only; B holds c_B − 2 m c_B, C holds 2 s c_B, A holds u,
  which sum to r. B sees u under a uniform mask, C and A see nothing. Both sharings are then
  re-randomised with zero sharings (a share sent on later, e.g. in a Beaver opening, must not show
  a neighbour what it already half knows). The three roles rotate over thirds of the bits, so
  every party sends the same bytes. (Two hardened RSS products instead send four replicated
  64-bit words per bit per party: 55 % of the replicated sampler's bytes.)
- **native ANDs** (:meth:`ReplicatedProvider.and_shares`, :meth:`~ReplicatedProvider.and_random`):
  the samplers ask for these when the provider has them, instead of a Beaver AND. Party i sends
  its XOR shares x_i, y_i to party i+1 only, then holds z_i = x_i y_i ⊕ x_i y_{i−1} ⊕ x_{i−1} y_i ⊕
  α_i (ABY3 §5.1 with the re-sharing folded into the next gate's input): 2 words to one party per
  AND word instead of Beaver's 2 words to each of two. When one input is a fresh jointly random
  plane (the comparison coins), it is made replicated from the pair streams and only the
  other input travels: 1 word to one party.
- **arithmetic triple / square**: random a, b and one hardened RSS product (not used by CrypTen's
  replicated protocol itself, which multiplies without triples; provided for completeness).
- ``wrap_rng`` is for the 2-out-of-n truncation, which replicated sharing replaces: refused.

Every party must make the same calls in the same order (the pair streams advance in
step), as with every CrypTen protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .crypten_compat import import_crypten
from .keystream import Keystream, new_key
from .tuple_pool import B2A_POOL_BITS, DevicePools, FlatPool

crypten = import_crypten()
from crypten.common.rng import generate_random_ring_element  # noqa: E402
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


@dataclass(frozen=True)
class PairStreams:
    """This party's two pairwise keystreams (:mod:`.keystream`, AES-256-CTR): ``ahead`` shared with
    the next party, ``behind`` with the previous one. Keys are fresh per session: each party draws
    the key it shares with the next one and sends it there over mTLS (:func:`exchange_pair_keys`)."""

    ahead: Keystream
    behind: Keystream


def exchange_pair_keys() -> PairStreams:
    """One message per party, at the same point of every party's program (provider start)."""
    mine = new_key()
    theirs = _replicate(torch.frombuffer(bytearray(mine), dtype=torch.uint8))
    return PairStreams(ahead=Keystream(mine), behind=Keystream(bytes(theirs.numpy().tobytes())))


def _binary_triple(
    pairs: PairStreams, size0: torch.Size, dev: torch.device, size1: torch.Size | None = None
) -> tuple[torch.Tensor, ...]:
    """This party's XOR shares of a fresh binary triple (a of ``size0``, b of ``size1``, default the
    same; c broadcast), made without a message (module docstring): its own components a_i, b_i
    from the stream shared with the next party, its neighbour's a_{i-1}, b_{i-1} from the one
    shared with the previous party."""
    size1 = size0 if size1 is None else size1
    a1, b1 = pairs.ahead.words(size0, dev), pairs.ahead.words(size1, dev)
    a2, b2 = pairs.behind.words(size0, dev), pairs.behind.words(size1, dev)
    return a1, b1, _cross(pairs, a1, a2, b1, b2)


def _rank() -> int:
    return crypten.communicator.get().get_rank()


def _random_bits(pairs: PairStreams, size: torch.Size, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """This party's arithmetic and XOR shares of fresh random bits, one masked word per bit from
    one party to one other (module docstring); roles rotate over thirds of the bits."""
    comm = crypten.communicator.get()
    rank = comm.get_rank()
    ahead, behind = pairs.ahead, pairs.behind
    n = size.numel()
    own = ahead.words((n,), dev) & 1  # c_rank
    back = behind.words((n,), dev) & 1  # c_{rank-1}
    r_a = torch.empty(n, dtype=torch.long, device=dev)
    bounds = [n * t // 3 for t in range(4)]
    sends, recvs = [], []
    for t in range(3):
        lo, hi = bounds[t], bounds[t + 1]
        a = (t + 1) % 3
        if rank == a:  # knows c_{A-1}, c_A: u; masks it with s shared with C = A-1
            u = own[lo:hi] ^ back[lo:hi]
            s = behind.words((hi - lo,), dev)
            sends.append(comm.isend((u + s).contiguous(), dst=(a + 1) % 3))
            r_a[lo:hi] = u
        elif rank == (a + 1) % 3:  # B: knows c_B (its own component); receives m = u + s
            m = torch.empty(hi - lo, dtype=torch.long, device=dev)
            recvs.append((lo, hi, m, comm.irecv(m, src=a)))
        else:  # C = A - 1: knows c_B (the component behind it) and s
            s = ahead.words((hi - lo,), dev)
            r_a[lo:hi] = 2 * s * back[lo:hi]
    for lo, hi, m, req in recvs:
        req.wait()
        c_b = own[lo:hi]
        r_a[lo:hi] = c_b - 2 * m * c_b
    for req in sends:
        req.wait()
    r_a += behind.words((n,), dev)  # an arithmetic zero sharing: drawn with the previous party,
    r_a -= ahead.words((n,), dev)  # minus the one drawn with the next (CrypTen's PRZS)
    r_b = own ^ (_zero_xor_sharing(pairs, torch.Size([n]), dev) & 1)
    return r_a.view(size), r_b.view(size)


def _replicate(share: torch.Tensor) -> torch.Tensor:
    """The previous party's share of the same value: ours goes to the next party (one message;
    CrypTen's own re-sharing step of its replicated products)."""
    ((_, theirs),) = replicated.replicate_shares([share])
    return theirs


def _cross(
    pairs: PairStreams, x: torch.Tensor, x_back: torch.Tensor, y: torch.Tensor, y_back: torch.Tensor
) -> torch.Tensor:
    """z_i = x_i y_i ⊕ x_i y_{i-1} ⊕ x_{i-1} y_i ⊕ α_i: XOR shares of x ∧ y from replicated inputs
    (``x_back`` and ``y_back`` are overwritten)."""
    z = torch.bitwise_and(x, y)
    if x.shape == y.shape:
        z ^= torch.bitwise_and(x, y_back, out=y_back)
        z ^= torch.bitwise_and(x_back, y, out=x_back)
    else:  # broadcasting (CrypTen's own circuits may ask for such triples)
        z = z ^ (x & y_back) ^ (x_back & y)
    z ^= _zero_xor_sharing(pairs, z.size(), z.device)
    return z


def _zero_xor_sharing(pairs: PairStreams, size: torch.Size, dev: torch.device) -> torch.Tensor:
    """This party's share of a pseudo-random XOR sharing of zero: the word drawn with the previous
    party ⊕ the word drawn with the next (CrypTen's BinarySharedTensor.PRZS, on the AES streams)."""
    zero = pairs.behind.words(size, dev)
    zero ^= pairs.ahead.words(size, dev)
    return zero


class ReplicatedProvider(TupleProvider):
    """CrypTen ``TupleProvider`` for ``cfg.mpc.protocol = "replicated"`` with 3 parties, no dealer."""

    NAME = PROVIDER_NAME

    def __init__(self) -> None:
        super().__init__()
        self._binary = DevicePools(lambda dev: FlatPool(lambda n: _binary_triple(self.pairs, torch.Size([n]), dev)))
        self._b2a = DevicePools(
            lambda dev: FlatPool(lambda n: _random_bits(self.pairs, torch.Size([n]), dev), B2A_POOL_BITS))
        self.binary_words = 0  # words of binary triples handed out (64 AND gates each): benchmarks
        self._pairs: PairStreams | None = None

    @property
    def pairs(self) -> PairStreams:
        if self._pairs is None:
            raise RuntimeError("ReplicatedProvider has no pair keys: start it with start_replicated_provider()")
        return self._pairs

    def reset(self) -> None:
        """Forget pooled tuples and pair keys (a new session: new generators, new parties)."""
        self._binary.clear()
        self._b2a.clear()
        self._pairs = None

    def connect(self) -> None:
        """Agree the session's pair keys with the neighbours (one message each way)."""
        _check_three()
        self._pairs = exchange_pair_keys()

    def and_shares(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """This party's XOR share of x ∧ y from its shares of x and y (equal shapes, int64 words):
        one message of both to the next party, no triple (module docstring, native ANDs)."""
        _check_three()
        m = x.numel()
        self.binary_words += m
        mine = torch.cat([x.reshape(-1), y.reshape(-1)])
        back = _replicate(mine)
        return _cross(self.pairs, x.reshape(-1), back[:m], y.reshape(-1), back[m:]).view(x.shape)

    def two_shares(self, x: torch.Tensor) -> torch.Tensor:
        """The three parties' additive int64 shares x_0 + x_1 + x_2 of a value made two: party 0
        holds x_0 − r, party 1 holds x_1 + x_2 + r, party 2 holds zeros, r fresh words from the
        stream parties 2 and 0 share (party 1 sees x_2 + r, uniform). One message, party 2 to
        party 1, one word a value: a circuit on the bits of the sum then adds two inputs, where
        a carry-save layer over three costs two ANDs (four words) a value."""
        _check_three()
        rank = _rank()
        x = x.contiguous()
        if rank == 0:
            return x - self.pairs.behind.words(x.size(), x.device)
        comm = crypten.communicator.get()
        if rank == 2:
            comm.send(x + self.pairs.ahead.words(x.size(), x.device), 1)
            return torch.zeros_like(x)
        return x + comm.recv(torch.empty_like(x), 2)

    def and_random(self, y: torch.Tensor, flip: torch.Tensor | None = None) -> torch.Tensor:
        """This party's XOR share of (U ⊕ flip) ∧ y, U fresh jointly random words (y's shape, every
        word exactly uniform), ``flip`` a public constant (None: none). U is made replicated from
        the pair streams, so only y travels: one word to the next party."""
        _check_three()
        dev = y.device
        self.binary_words += y.numel()
        u, u_back = self.pairs.ahead.words(y.size(), dev), self.pairs.behind.words(y.size(), dev)
        if flip is not None:  # a public constant goes into component 0: held by parties 0 and 1
            rank = _rank()
            if rank == 0:
                u ^= flip
            elif rank == 1:
                u_back ^= flip
        y = y.contiguous()
        return _cross(self.pairs, u, u_back, y, _replicate(y))

    def generate_binary_triple(self, size0: Any, size1: Any, device: Any = None):
        """Triples of equal shapes are cut from a pool of :data:`~.tuple_pool.POOL_WORDS` words
        (:mod:`.tuple_pool`): fewer, larger PRG draws."""
        _check_three()
        dev = _device(device)
        size0, size1 = torch.Size(size0), torch.Size(size1)
        self.binary_words += max(size0.numel(), size1.numel())
        if size0 == size1:
            return tuple(BinarySharedTensor.from_shares(t) for t in self._binary.take(dev, size0))
        return tuple(BinarySharedTensor.from_shares(t) for t in _binary_triple(self.pairs, size0, dev, size1))

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
    prov.connect()
    return prov
