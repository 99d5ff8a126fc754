"""Beaver-triple dealer (CrypTen's TTP model) over the gRPC communicator.

Why: CrypTen's default provider TFP makes party 0 generate every triple, so party 0 could
unmask every product. CrypTen's TTP provider moves that to a third party but talks to raw
``torch.distributed`` (seed exchange, request loop), so it cannot run over our mTLS transport.
This module keeps CrypTen's TTP structure and replaces only the plumbing:

* Seeds: the dealer sends each party i its own seed s_i (one message per party, over mTLS).
  Party i generates its shares of a, b (and of c, for i ≠ 0) locally from s_i; the dealer
  regenerates all of them, so it knows a, b, c in the clear (that is the TTP trust model: the
  dealer must not collude with a party) but never sees any party input or any share of one.
* Requests: for each tuple only party 0 sends the dealer a request (function name, sizes, op
  name, and which party gets the correction) and that party receives its correction
  ``c_r = c − Σ_{i≠r} c_i``; the others generate their shares. Parties other than 0 send the
  dealer nothing at all after start-up. The dealer refuses a request that carries anything but
  sizes, op names, a device string and a party rank. Binary triples of equal shapes and B2A bits
  are elementwise, so they are requested as flat pools and cut in the circuit's order
  (:mod:`.tuple_pool`), each pool requested one ahead: party 0 posts the request and the
  corrected party collects the answer when the pool is needed (:meth:`DealerClient.post`/
  ``result``; the dealer answers in order). The dealer then sees only pool sizes, not the
  circuit's shapes. Pool corrections go to the parties in turn (refill j to party j mod m):
  they are one word per word of triple (and per B2A bit), a third of the bytes a party moves in
  the noise samplers, which all fell on party 0 and made it the slowest; other tuples' go to
  party 0.

Selection: :func:`register_dealer_provider` adds provider ``"DEALER"`` to CrypTen's provider
table, so ``cfg.mpc.provider = "DEALER"`` routes every Beaver triple, square pair, binary triple,
wrap and B2A pair through it. Because the name is not "TTP", ``crypten.init`` does not try to
start CrypTen's own TTP client (which the gRPC communicator refuses), so no change to
``communicator.py`` is needed: start the client with :func:`start_dealer_client` right after
``init_crypten``; run :func:`run_dealer` in the dealer process.

The PRG is CrypTen's (torch's Mersenne twister seeded with 63 bits from ``secrets``), kept so
the dealer can reuse CrypTen's own tuple code (``TTPServer`` methods) draw for draw.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ._proto import transport_pb2 as pb
from .communicator import GrpcCommunicator, init_crypten, uninit_crypten
from .crypten_compat import import_crypten, plain
from .pki import Identity
from .transport import PartyTable, TransportOptions, TransportServer, codec
from .transport.deadline import seconds
from .transport.errors import PeerUnavailable, TransportClosed, TransportError, TransportTimeout
from .tuple_pool import B2A_POOL_BITS, DevicePools, FlatPool, Prefetch

crypten = import_crypten()
from crypten.common.rng import generate_kbit_random_tensor, generate_random_ring_element  # noqa: E402
from crypten.config import cfg  # noqa: E402
from crypten.mpc.primitives import ArithmeticSharedTensor, BinarySharedTensor  # noqa: E402
from crypten.mpc.provider.provider import TupleProvider  # noqa: E402
from crypten.mpc.provider.ttp_provider import TTPServer  # noqa: E402

log = logging.getLogger(__name__)

PROVIDER_NAME = "DEALER"
FUNCTIONS = ("additive", "square", "binary", "wraps", "B2A")
BILINEAR_OPS = ("mul", "matmul", "conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d")
OP_SEED, OP_REQUEST, OP_RESULT = "dealer/seed", "dealer/request", "dealer/result"
TERMINATE = "terminate"
TENSOR, OBJECT = pb.PAYLOAD_KIND_TENSOR, pb.PAYLOAD_KIND_OBJECT


class DealerError(RuntimeError):
    """The dealer refused a request, or the dealer client is not running."""


def _dealer_rank(comm: GrpcCommunicator) -> int:
    rank = comm.table.dealer_rank
    if rank is None:
        raise DealerError(f"job {comm.table.job_id}: the party table has no member with role 'dealer'")
    return rank


# ---------------------------------------------------------------------- requests (JSON text)


def _to_json(v: Any, depth: int = 0) -> Any:
    """Sizes, ints, op names only: anything else (a tensor above all) is refused at the sender."""
    if depth > 6:
        raise DealerError("request nested too deeply")
    if isinstance(v, torch.Size):
        return {"size": [int(d) for d in v]}
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, list | tuple):
        return [_to_json(x, depth + 1) for x in v]
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {"kw": {k: _to_json(x, depth + 1) for k, x in v.items()}}
    raise DealerError(f"request carries a {type(v).__name__}: only sizes, ints and names are accepted")


def _from_json(v: Any, depth: int = 0) -> Any:
    if depth > 6:
        raise DealerError("request nested too deeply")
    if isinstance(v, dict):
        if set(v) == {"size"} and isinstance(v["size"], list) and all(type(d) is int and d >= 0 for d in v["size"]):
            return torch.Size(v["size"])
        if set(v) == {"kw"} and isinstance(v["kw"], dict):
            return {str(k): _from_json(x, depth + 1) for k, x in v["kw"].items()}
        raise DealerError("malformed request value")
    if isinstance(v, list):
        return tuple(_from_json(x, depth + 1) for x in v)
    if v is None or isinstance(v, bool | int | str):
        return v
    raise DealerError(f"request carries a {type(v).__name__}")


def encode_request(function: str, device: Any, args: tuple[Any, ...], kwargs: dict[str, Any], to: int = 0) -> str:
    """One tuple request as JSON text: what the dealer can receive is plain data by construction
    (and the transport's object codec cannot carry empty containers such as ``kwargs={}``);
    ``to``: the party that receives the correction."""
    return json.dumps({
        "function": function,
        "device": None if device is None else str(device),
        "args": _to_json(list(args)),
        "kwargs": _to_json(dict(kwargs)),
        "to": int(to),
    }, separators=(",", ":"))


def decode_request(text: Any) -> dict[str, Any]:
    if not isinstance(text, str) or len(text) > 64 * 1024:
        raise DealerError("malformed request")
    try:
        raw = json.loads(text)
    except ValueError:
        raise DealerError("malformed request: not JSON") from None
    if not isinstance(raw, dict) or set(raw) - {"to"} != {"function", "device", "args", "kwargs"}:
        raise DealerError("malformed request")
    to = raw.get("to", 0)
    if type(to) is not int or not 0 <= to < 1 << 16:
        raise DealerError("malformed request: 'to' must be a party rank")
    device = raw["device"]
    if device is not None and (not isinstance(device, str) or device.split(":")[0] not in ("cpu", "cuda")):
        raise DealerError("malformed request device")
    kwargs = _from_json(raw["kwargs"])
    if not isinstance(kwargs, dict):
        raise DealerError("malformed request kwargs")
    return {"function": raw["function"], "device": device, "args": _from_json(raw["args"]), "kwargs": kwargs,
            "to": to}


# ---------------------------------------------------------------------- party side


class DealerClient:
    """A party's end: its PRG seeded by the dealer; party 0 also sends the requests, and each
    party receives the corrections addressed to it."""

    def __init__(self, comm: GrpcCommunicator) -> None:
        self.comm = comm
        self.dealer = _dealer_rank(comm)
        self.rank = comm.get_rank()
        ep = comm.endpoint
        seed = int(ep.recv_tensor(self.dealer, OP_SEED, ep.deadline()).item())
        comm.comm_rounds += 1
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(seed)
        self.generator_cuda: torch.Generator | None = None
        if torch.cuda.is_available():
            self.generator_cuda = torch.Generator(device="cuda")
            self.generator_cuda.manual_seed(seed)
        self.parties = comm.get_world_size()
        self.requests = 0
        self._posted = 0  # requests made (sent by party 0), the same count at every party
        self._mine: list[int] = []  # tickets whose answer comes to this party, in the dealer's order
        self._answers: dict[int, torch.Tensor] = {}
        self._devices: dict[int, Any] = {}

    def get_generator(self, device: Any = None) -> torch.Generator:
        dev = torch.device(device if device is not None else "cpu")
        if dev.type == "cuda":
            if self.generator_cuda is None:
                raise DealerError("CUDA tuple requested but CUDA is not available")
            return self.generator_cuda
        return self.generator

    def request(self, function: str, device: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Party 0 only: ask for the dealer's correction share (one round trip)."""
        if self.rank != 0:
            raise DealerError("only party 0 sends requests to the dealer")
        return self.result(self.post(function, device, *args, **kwargs))

    def post(self, function: str, device: Any, *args: Any, to: int = 0, **kwargs: Any) -> int:
        """A request whose correction goes to party ``to``: party 0 sends it now; the parties
        that call this (every party for pooled tuples, in the same order; party 0 alone for the
        others) keep its ticket, and party ``to`` collects the answer later with :meth:`result`
        (the dealer answers in order, so requests may be in flight together: a prefetched pool)."""
        if not 0 <= to < self.parties:
            raise DealerError(f"no party {to} to receive a correction")
        if self.rank == 0:
            ep = self.comm.endpoint
            ep.send(self.dealer, OP_REQUEST, encode_request(function, device, args, kwargs, to), kind=OBJECT,
                    deadline=ep.deadline())
        ticket = self._posted
        self._posted += 1
        if to == self.rank:
            self._mine.append(ticket)
            self._devices[ticket] = device
        return ticket

    def result(self, ticket: int) -> torch.Tensor:
        """The answer to request ``ticket`` (addressed to this party); answers to this party's
        earlier requests are received first and kept."""
        ep = self.comm.endpoint
        while ticket not in self._answers:
            if not self._mine:
                raise DealerError(f"no dealer answer {ticket} is outstanding for this party")
            deadline = ep.deadline()
            self._answers[self._mine.pop(0)] = ep.recv_tensor(self.dealer, OP_RESULT, deadline)
            self.comm.comm_rounds += 1 if self.rank else 2
            self.requests += 1
        out = self._answers.pop(ticket)
        device = self._devices.pop(ticket)
        return out.to(device) if device is not None else out

    def terminate(self) -> None:
        if self.rank == 0:
            ep = self.comm.endpoint
            ep.send(self.dealer, OP_REQUEST, TERMINATE, kind=OBJECT, deadline=ep.deadline())


class DealerProvider(TupleProvider):
    """CrypTen ``TupleProvider`` whose tuples come from the dealer (CrypTen's TTP algorithms)."""

    NAME = PROVIDER_NAME

    def __init__(self) -> None:
        super().__init__()
        self.client: DealerClient | None = None
        self._binary = DevicePools(lambda dev: FlatPool(Prefetch(lambda n: self._binary_start(dev, n), self._collect)))
        self._b2a = DevicePools(lambda dev: FlatPool(Prefetch(lambda n: self._b2a_start(dev, n), self._collect),
                                                     B2A_POOL_BITS))
        self.binary_words = 0  # words of binary triples handed out (64 AND gates each): benchmarks
        self._refills = 0  # pool refills started: refill j's correction goes to party j mod m

    def _client(self) -> DealerClient:
        if self.client is None:
            raise DealerError("dealer client not started: call start_dealer_client(comm) after init_crypten")
        return self.client

    def reset(self, client: DealerClient | None, *, drain: bool = False) -> None:
        """A new session's client (or none); ``drain``: first collect the prefetched answers, which
        the dealer sends whatever happens (only on a clean stop: after a failure it may be gone)."""
        if drain:  # answers are matched by ticket: the pools may be drained in any order
            self._binary.drain()
            self._b2a.drain()
        self._binary.clear()
        self._b2a.clear()
        self._refills = 0
        self.client = client

    def _corrected(self, cl: DealerClient) -> int:
        """The party that receives the next pool refill's correction (module docstring)."""
        to = self._refills % cl.parties
        self._refills += 1
        return to

    def generate_additive_triple(self, size0: Any, size1: Any, op: str, device: Any = None, *args: Any, **kwargs: Any):
        cl = self._client()
        g = cl.get_generator(device)
        a = generate_random_ring_element(size0, generator=g, device=device)
        b = generate_random_ring_element(size1, generator=g, device=device)
        if cl.rank == 0:
            c = cl.request("additive", device, size0, size1, op, *args, **kwargs)
        else:
            c_size = getattr(torch, op)(a, b, *args, **kwargs).size()
            c = generate_random_ring_element(c_size, generator=g, device=device)
        return tuple(ArithmeticSharedTensor.from_shares(t, precision=0) for t in (a, b, c))

    def square(self, size: Any, device: Any = None):
        cl = self._client()
        g = cl.get_generator(device)
        r = generate_random_ring_element(size, generator=g, device=device)
        if cl.rank == 0:
            r2 = cl.request("square", device, size)
        else:
            r2 = generate_random_ring_element(size, generator=g, device=device)
        return tuple(ArithmeticSharedTensor.from_shares(t, precision=0) for t in (r, r2))

    def generate_binary_triple(self, size0: Any, size1: Any, device: Any = None):
        """Triples of equal shapes are cut from a pool (:mod:`.tuple_pool`: a few dealer round
        trips per noise batch instead of one per AND round, each requested a pool ahead); triples
        that broadcast (CrypTen's own circuits may ask for them) are requested one at a time."""
        cl = self._client()
        size0, size1 = torch.Size(size0), torch.Size(size1)
        self.binary_words += max(size0.numel(), size1.numel())
        if size0 == size1:
            return tuple(BinarySharedTensor.from_shares(t) for t in self._binary.take(device, size0))
        g = cl.get_generator(device)
        a = generate_kbit_random_tensor(size0, generator=g, device=device)
        b = generate_kbit_random_tensor(size1, generator=g, device=device)
        if cl.rank == 0:
            c = cl.request("binary", device, size0, size1)
        else:
            c = generate_kbit_random_tensor(torch.broadcast_tensors(a, b)[0].size(), generator=g, device=device)
        return tuple(BinarySharedTensor.from_shares(t) for t in (a, b, c))

    def _binary_start(self, device: Any, n: int) -> tuple[Any, ...]:
        cl = self._client()
        g = cl.get_generator(device)
        size = torch.Size([n])
        a = plain(generate_kbit_random_tensor(size, generator=g, device=device))
        b = plain(generate_kbit_random_tensor(size, generator=g, device=device))
        to = self._corrected(cl)
        ticket = cl.post("binary", device, size, size, to=to)
        if cl.rank == to:
            return a, b, ticket
        return a, b, plain(generate_kbit_random_tensor(size, generator=g, device=device))

    def _collect(self, handle: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
        """A started refill's tensors: party 0's dealer tickets (ints) replaced by the answers."""
        return tuple(self._client().result(x) if isinstance(x, int) else x for x in handle)

    def wrap_rng(self, size: Any, device: Any = None):
        cl = self._client()
        g = cl.get_generator(device)
        r = plain(generate_random_ring_element(size, generator=g, device=device))
        if cl.rank == 0:
            theta_r = cl.request("wraps", device, size)
        else:
            theta_r = plain(generate_random_ring_element(size, generator=g, device=device))
        return tuple(ArithmeticSharedTensor.from_shares(t, precision=0) for t in (r, theta_r))

    def B2A_rng(self, size: Any, device: Any = None):
        """Random bits as arithmetic and binary shares, cut from a prefetched pool like the binary
        triples (they are elementwise too): the samplers convert bits in chunks, each of which
        would otherwise wait for a dealer round trip."""
        r_a, r_b = self._b2a.take(device, torch.Size(size))
        return ArithmeticSharedTensor.from_shares(r_a, precision=0), BinarySharedTensor.from_shares(r_b)

    def _b2a_start(self, device: Any, n: int) -> tuple[Any, ...]:
        cl = self._client()
        g = cl.get_generator(device)
        size = torch.Size([n])
        r_b = plain(generate_kbit_random_tensor(size, bitlength=1, generator=g, device=device))
        to = self._corrected(cl)
        ticket = cl.post("B2A", device, size, to=to)
        if cl.rank == to:
            return ticket, r_b
        return plain(generate_random_ring_element(size, generator=g, device=device)), r_b


def register_dealer_provider() -> DealerProvider:
    """Add provider "DEALER" to CrypTen's table (idempotent) so ``cfg.mpc.provider`` can name it."""
    providers: dict[str, Any] = vars(crypten.mpc)["__SUPPORTED_PROVIDERS"]
    prov = providers.get(PROVIDER_NAME)
    if not isinstance(prov, DealerProvider):
        prov = DealerProvider()
        providers[PROVIDER_NAME] = prov
    return prov


def start_dealer_client(comm: GrpcCommunicator | None = None) -> DealerProvider:
    """In every party, after ``init_crypten``: receive the seed and select the dealer provider."""
    comm = comm or crypten.communicator.get()
    prov = register_dealer_provider()
    prov.reset(DealerClient(comm))
    cfg.mpc.provider = PROVIDER_NAME
    return prov


def stop_dealer_client(*, send_terminate: bool = True) -> None:
    """In every party, before ``uninit_crypten``: party 0 tells the dealer the job is over
    (``send_terminate=False`` after a failure: the dealer may be gone; it stops when party 0 does)."""
    prov = register_dealer_provider()
    if prov.client is not None:
        client = prov.client
        try:
            if send_terminate:
                prov.reset(client, drain=True)
                client.terminate()
        finally:
            prov.reset(None)


# ---------------------------------------------------------------------- dealer side


@dataclass
class DealerReport:
    """What the dealer saw: request kinds, sizes and bytes, per source (for audits and tests)."""

    requests: int = 0
    by_function: dict[str, int] = field(default_factory=dict)
    elements_served: int = 0
    ended_by: str = ""
    transport: dict[str, Any] = field(default_factory=dict)
    answers_to: dict[int, int] = field(default_factory=dict)  # corrections sent, per party rank
    # (function, op, request bytes, party that got the correction)
    request_log: list[tuple[str, str, int, int]] = field(default_factory=list)


class DealerServer(TTPServer):
    """Serves party 0's requests with CrypTen's own TTP tuple code (inherited methods)."""

    def __init__(self, comm: GrpcCommunicator, *, idle_timeout_s: float | None = None, log_limit: int = 10_000) -> None:
        # TTPServer.__init__ would call crypten.init and torch.distributed: not used.
        self.comm = comm
        self.rank = _dealer_rank(comm)
        if comm.get_rank() != self.rank:
            raise DealerError("DealerServer runs in the dealer member of the party table")
        self.world_size = comm.get_world_size()
        self.device = "cpu"
        self.idle_timeout_s = idle_timeout_s
        self.log_limit = log_limit
        self.report = DealerReport()
        self._to = 0  # the party that receives the current request's correction
        self._setup_generators()

    def _get_generators(self, device: Any = None) -> list[torch.Generator]:
        """The parties' generators with the corrected party's first: CrypTen's TTPServer computes
        party 0's correction by leaving out the first generator (``remove_rank``), so this makes it
        leave out the party the request names. Each generator is still drawn in its own order, and
        the shares are summed (or XORed), so the order of the list changes nothing else."""
        gens = super()._get_generators(device=device)
        return [gens[self._to], *gens[: self._to], *gens[self._to + 1 :]]

    def _setup_generators(self) -> None:
        ep = self.comm.endpoint
        deadline = ep.deadline()
        seeds = [secrets.randbits(63) for _ in range(self.world_size)]
        futures = [
            ep.post(i, OP_SEED, torch.tensor(s, dtype=torch.long), kind=TENSOR, deadline=deadline)
            for i, s in enumerate(seeds)
        ]
        self.generators = [torch.Generator(device="cpu").manual_seed(s) for s in seeds]
        cuda = torch.cuda.is_available()
        self.generators_cuda = [torch.Generator(device="cuda").manual_seed(s) if cuda else None for s in seeds]
        ep.wait_all(futures, deadline)
        del seeds

    def _next_request(self) -> Any:
        """Wait for party 0's next request: no deadline while party 0 is alive (jobs idle), unless
        ``idle_timeout_s``; a vanished party 0 ends the loop (PeerUnavailable).

        The wait is a loop of receives of at most ``deadline_s`` (30 s at most) each, so that each
        one re-checks that party 0 is alive; the timeout it ends with states the whole wait (all
        the loop's receives) and the idle limit, not the last receive's share of it."""
        ep = self.comm.endpoint
        ticket = ep.expect(0, OP_REQUEST, OBJECT)
        idle = self.idle_timeout_s
        started = time.monotonic()
        end = None if idle is None else started + idle
        while True:
            deadline = ep.deadline(min(ep.options.deadline_s, 30.0))
            try:
                msg = ep.collect(ticket, deadline if end is None else min(deadline, end))
                break
            except TransportTimeout as exc:
                now = time.monotonic()
                if end is not None and now >= end:
                    raise TransportTimeout(
                        f"job {self.comm.table.job_id}: {OP_REQUEST}: no request from {ep.describe(0)} for "
                        f"{now - started:.1f} s (limit {self._idle_limit()})", waited_s=now - started, limit_s=idle
                    ) from exc
        self._last_request_bytes = len(msg.data)
        return codec.decode_object(msg.data)

    def _idle_limit(self) -> str:
        """The idle limit as text, e.g. "100 s: idle_timeout_s = 5 × deadline_s" (the factor when whole)."""
        idle, per_call = self.idle_timeout_s or 0.0, self.comm.endpoint.options.deadline_s
        text = f"{seconds(idle)} s: idle_timeout_s"
        factor = idle / per_call
        if factor >= 2 and abs(factor - round(factor)) < 1e-9:
            text += f" = {round(factor)} × deadline_s"
        return text

    def _serve_one(self, message: Any) -> torch.Tensor:
        message = decode_request(message)
        function = message["function"]
        if function not in FUNCTIONS:
            raise DealerError(f"unknown tuple function {function!r}")
        args, kwargs = tuple(message["args"]), dict(message["kwargs"])
        op = ""
        if function == "additive":
            if len(args) < 3 or args[2] not in BILINEAR_OPS:
                raise DealerError(f"additive triple for an op outside {BILINEAR_OPS}")
            op = args[2]
        self.device = message["device"] or "cpu"
        if not 0 <= message["to"] < self.world_size:
            raise DealerError(f"no party {message['to']} to receive a correction")
        self._to = message["to"]
        result = getattr(self, function)(*args, **kwargs)
        rep = self.report
        rep.requests += 1
        rep.by_function[function] = rep.by_function.get(function, 0) + 1
        rep.elements_served += result.numel()
        if len(rep.request_log) < self.log_limit:
            rep.request_log.append((function, op, self._last_request_bytes, self._to))
        rep.answers_to[self._to] = rep.answers_to.get(self._to, 0) + 1
        return result

    def serve(self) -> DealerReport:
        """Serve until party 0 sends "terminate" or goes away; never holds any party input."""
        ep = self.comm.endpoint
        try:
            while True:
                message = self._next_request()
                if message == TERMINATE:
                    self.report.ended_by = "terminate"
                    break
                result = self._serve_one(message)
                ep.send(self._to, OP_RESULT, result, kind=TENSOR, deadline=ep.deadline())
        except (PeerUnavailable, TransportClosed, TransportTimeout) as exc:
            self.report.ended_by = f"{type(exc).__name__}: {exc}"
            log.warning("dealer: job %s ended without terminate: %s", self.comm.table.job_id, type(exc).__name__)
        self.report.transport = self.comm.transport_stats()
        return self.report


def run_dealer(
    table: PartyTable,
    identity: Identity,
    *,
    server: TransportServer | None = None,
    options: TransportOptions | None = None,
    idle_timeout_s: float | None = None,
) -> DealerReport:
    """The dealer process's main: join the job, seed the parties, serve, shut down."""
    if identity.role != "dealer":
        raise DealerError(f"identity {identity.name!r} has role {identity.role!r}, not 'dealer'")
    comm = init_crypten(table, identity.name, identity, server=server, options=options)
    try:
        return DealerServer(comm, idle_timeout_s=idle_timeout_s).serve()
    finally:
        try:
            uninit_crypten()
        except TransportError:
            pass


# ---------------------------------------------------------------------- 3-party RSS, hardened

RSS_OPS = ("mul", "matmul", "conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d", "square")


def harden_crypten_rss() -> None:
    """Add ABY3's zero-sharing to CrypTen 0.4.1's replicated products (idempotent, per process).

    Why: CrypTen's RSS product leaves party i with z_i = x_i y_i + x_i y_{i-1} + x_{i-1} y_i and
    nothing else (ABY3 §3.2 adds α_i, a share of zero), and its 3-party truncation then sends z_2
    to party 1, which holds x_1, y_1, x_0, y_0 and so learns (x − x_0)(y − y_0): from one product
    with its own input it recovers the other input exactly (tests/mpc/test_dealer.py shows it).
    Adding CrypTen's own pseudo-random zero sharing (PRZS: party i adds r_{i,i+1} − r_{i-1,i})
    masks z_2 with r_{2,0}, which party 1 does not know. Cost: two local PRG draws, no round.
    Every party must call this before its first product (the PRZS generators advance in step).
    """
    from crypten.mpc.primitives import replicated

    if getattr(replicated, "_mpc_erm_hardened", False):
        return
    for name in RSS_OPS:
        original = getattr(replicated, name)

        def rerandomised(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            z = _original(*args, **kwargs)
            z.share = z.share + ArithmeticSharedTensor.PRZS(z.share.size(), device=z.share.device).share
            return z

        setattr(replicated, name, rerandomised)
    replicated._mpc_erm_hardened = True


def rss_hardened() -> bool:
    from crypten.mpc.primitives import replicated

    return bool(getattr(replicated, "_mpc_erm_hardened", False))


__all__ = [
    "PROVIDER_NAME",
    "RSS_OPS",
    "DealerClient",
    "DealerError",
    "DealerProvider",
    "DealerReport",
    "DealerServer",
    "harden_crypten_rss",
    "rss_hardened",
    "register_dealer_provider",
    "run_dealer",
    "start_dealer_client",
    "stop_dealer_client",
]
