"""CrypTen ``Communicator`` over the gRPC share transport (mutual TLS, deadlines, real byte counts).

Why: CrypTen only speaks torch.distributed/gloo (no TLS, no authentication, ranks from
environment variables). This communicator gives CrypTen the same calls on top of
:class:`mpc_erm.mpc.transport.Endpoint`: ranks and addresses from the job's party table, every
byte over mTLS with the peer's identity pinned, every wait bounded by a deadline whose error
names the peer, and collectives built from keyed point-to-point messages (see
``transport/endpoint.py`` for the keys).

How CrypTen is pointed at it: ``crypten.communicator.get()`` hard-codes CrypTen's two classes, so
:func:`init_crypten` wraps the module functions ``get``, ``_init``, ``is_initialized`` and
``uninit`` once (every CrypTen module calls them as ``comm.get()`` at run time), parks the
job's configuration, and calls the ordinary ``crypten.init()``: its call to ``comm._init``
builds this communicator from the parked configuration, then CrypTen seeds its PRNGs over it
exactly as under gloo. With nothing parked the wrapped functions fall through to CrypTen's
own, so plain ``crypten.init()`` keeps working.

Collectives (all on point-to-point messages, one round each, results combined in rank order
so every party gets bit-identical results, as with gloo):
broadcast/scatter: src posts to each member; gather/reduce: each member posts to dst;
all_gather/barrier and small all_reduce: every member posts to every other (one round,
(P-1)·n bytes out per party). A large all_reduce among 3+ parties (the reveal of a big
aggregate) runs reduce-scatter + all-gather instead: two rounds, 2(P-1)/P·n bytes out.

The *_obj calls carry a closed set of types without pickle (``transport/codec.py``); CrypTen's
own sizes, seeds and TTP requests fit in it. An object of any other type (e.g. an nn.Module in
``crypten.load_from_party``) is refused with PayloadError.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch.distributed import ReduceOp

from ._proto import transport_pb2 as pb
from .crypten_compat import import_crypten, rewrap_all, unwrap_all
from .pki import Identity
from .transport import Endpoint, PartyTable, TransportError, TransportOptions, TransportServer
from .transport.errors import ProtocolDesync

crypten = import_crypten()
from crypten.communicator.communicator import Communicator  # noqa: E402  (after the compat shim)

log = logging.getLogger(__name__)

TENSOR, OBJECT, TOKEN = pb.PAYLOAD_KIND_TENSOR, pb.PAYLOAD_KIND_OBJECT, pb.PAYLOAD_KIND_TOKEN
# all_reduce of at least this many bytes among 3+ parties goes reduce-scatter + all-gather.
SCATTERED_ALL_REDUCE_BYTES = 256 << 10
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Group:
    """A set of ranks a collective runs among (CrypTen passes torch.distributed groups)."""

    ranks: tuple[int, ...]
    name: str = "group"


def _reduce_fn(op: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    table: dict[Any, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
        ReduceOp.SUM: torch.add,  # int64 shares wrap around mod 2^64, as ring arithmetic needs
        ReduceOp.BXOR: torch.bitwise_xor,
        ReduceOp.BAND: torch.bitwise_and,
        ReduceOp.BOR: torch.bitwise_or,
        ReduceOp.PRODUCT: torch.mul,
        ReduceOp.MIN: torch.minimum,
        ReduceOp.MAX: torch.maximum,
    }
    for key, fn in table.items():
        if op == key:
            return fn
    raise ValueError(f"reduce op {op} is not supported by the gRPC communicator")


def _counted(func: F) -> F:
    """CrypTen's ``_logging`` semantics (one round per call, wall time) without its verbose switch.

    Bytes are not estimated here: ``get_communication_stats`` reads what the transport moved.
    """

    @functools.wraps(func)
    def wrapper(self: GrpcCommunicator, *args: Any, **kwargs: Any) -> Any:
        if self.world_size < 2 and self.rank < self.world_size:  # CrypTen's single-party shortcut
            if func.__name__ in ("gather", "all_gather"):
                return [args[0]]
            if args:
                return args[0]
        tic = time.perf_counter()
        try:
            # CrypTen's CUDA shares arrive wrapped in CUDALongTensor: the transport takes the
            # plain tensor and CrypTen gets back the type it sent (crypten_compat.plain)
            args, wrapped = unwrap_all(args)
            got = func(self, *args, **kwargs)
            return rewrap_all(got) if wrapped else got
        finally:
            self.comm_rounds += 1
            self.comm_time += time.perf_counter() - tic

    return wrapper  # type: ignore[return-value]


class _Request:
    """What isend/irecv return: ``wait()`` finishes the transfer (and counts its time)."""

    def __init__(self, comm: GrpcCommunicator, finish: Callable[[], None]) -> None:
        self._comm = comm
        self._finish: Callable[[], None] | None = finish

    def wait(self) -> None:
        if self._finish is None:
            return
        tic = time.perf_counter()
        try:
            self._finish()
        finally:
            self._finish = None
            self._comm.comm_time += time.perf_counter() - tic

    def is_completed(self) -> bool:
        return self._finish is None


@dataclass
class _Pending:
    table: PartyTable
    rank: int
    identity: Identity
    server: TransportServer | None
    options: TransportOptions
    connect: bool


class GrpcCommunicator(Communicator):
    """CrypTen communicator for one job; one per process (CrypTen keeps global state)."""

    BYTES_PER_ELEMENT = 8
    instance: GrpcCommunicator | None = None
    _pending: _Pending | None = None

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        table = endpoint.table
        self.table = table
        self.rank = endpoint.rank
        self.world_size = table.world_size
        self.main_group = Group(tuple(range(self.world_size)), "main")
        # The TTP groups CrypTen's TTP provider names: all members, and party 0 + dealer.
        if table.dealer_rank is not None:
            self.ttp_group = Group(tuple(range(self.world_size + 1)), "ttp")
            self.ttp_comm_group = Group((0, table.dealer_rank), "ttp_comm")
        else:
            self.ttp_group = self.main_group
            self.ttp_comm_group = None
        self.ttp_initialized = False
        self._name = table.member(self.rank).name
        self._bytes_baseline = 0
        # SHA-256 over every all_reduce result in order: what this party saw opened. The parties
        # compare it at each agreement (mpc_erm.mpc.agreement.agree_on), so an opening that gave
        # two parties different values (a sampler coin, a comparison, a Beaver opening) stops the
        # job at the next agreement, before the release that follows from it is used.
        self._openings = hashlib.sha256(b"mpc-erm openings v1")
        self.reset_communication_stats()

    def openings_digest(self) -> bytes:
        """The digest of every value opened so far by an all_reduce, in order (32 bytes)."""
        return self._openings.copy().digest()

    def _opened(self, results: list[torch.Tensor]) -> None:
        for t in results:
            v = t.detach().to("cpu").contiguous()
            self._openings.update(f"{v.dtype}{tuple(v.shape)}".encode())
            self._openings.update(v.reshape(-1).view(torch.uint8).numpy())

    # ------------------------------------------------------------------ CrypTen class API

    @classmethod
    def is_initialized(cls) -> bool:
        return cls.instance is not None

    @classmethod
    def get(cls) -> GrpcCommunicator | None:
        return cls.instance

    @classmethod
    def initialize(cls, rank: int = 0, world_size: int = 1, init_ttp: bool = False) -> None:
        """Called through ``crypten.communicator._init`` by ``crypten.init``; rank/world size come
        from the parked party table, not from these arguments."""
        pending = cls._pending
        if pending is None:
            raise RuntimeError("GrpcCommunicator.initialize: use mpc_erm.mpc.communicator.init_crypten")
        if init_ttp:
            # CrypTen's TTPClient/TTPServer bypass the communicator: _setup_generators calls
            # torch.distributed.irecv/isend/barrier directly. The dealer service replaces them.
            raise NotImplementedError(
                "CrypTen's TTP provider talks to torch.distributed directly and cannot run over the "
                "gRPC communicator; use the dealer provider (mpc_erm.mpc) or TFP in unit tests"
            )
        endpoint = Endpoint(
            pending.table, pending.rank, pending.identity, server=pending.server, options=pending.options
        )
        try:
            if pending.connect:
                endpoint.connect()
        except BaseException:
            endpoint.close()
            raise
        cls.instance = cls(endpoint)
        log.info("gRPC communicator: job %s rank %d of %d", pending.table.job_id, pending.rank, cls.instance.world_size)

    @classmethod
    def shutdown(cls) -> None:
        inst = cls.instance
        cls.instance = None
        if inst is not None:
            inst.endpoint.close()

    # ------------------------------------------------------------------ identity

    def get_world_size(self) -> int:
        return self.world_size

    def get_rank(self) -> int:
        return self.rank

    def get_ttp_rank(self) -> int:
        """The dealer's rank (CrypTen's convention: world_size)."""
        return self.world_size

    def set_name(self, name: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"improper name provided to process on rank {self.rank}")
        self._name = name

    def get_name(self) -> str:
        return self._name

    def get_distributed_backend(self) -> str:
        return "grpc"

    # ------------------------------------------------------------------ stats

    def _moved_bytes(self) -> int:
        t = self.endpoint.stats.totals()
        return t.bytes_sent + t.bytes_received

    def reset_communication_stats(self) -> None:
        self.comm_rounds = 0
        self.comm_time = 0.0
        self._bytes_baseline = self._moved_bytes()
        self.comm_bytes = 0

    def get_communication_stats(self) -> dict[str, Any]:
        """CrypTen's dict (rounds, bytes, time) with bytes = payload bytes this party sent plus
        received since the last reset (what gloo's estimate means, but measured)."""
        t = self.endpoint.stats.totals()
        self.comm_bytes = t.bytes_sent + t.bytes_received - self._bytes_baseline
        return {
            "rounds": self.comm_rounds,
            "bytes": self.comm_bytes,
            "time": self.comm_time,
        }

    def print_communication_stats(self) -> None:
        self.get_communication_stats()
        super().print_communication_stats()

    def transport_stats(self) -> dict[str, object]:
        """Cumulative per-peer messages/bytes/chunks of this job (never reset)."""
        return self.endpoint.stats.as_dict()

    # ------------------------------------------------------------------ helpers

    def _group(self, group: Group | None) -> tuple[int, ...]:
        ranks = (group or self.main_group).ranks
        if self.rank not in ranks:
            raise ValueError(f"rank {self.rank} is not in {group}")
        return ranks

    def _others(self, ranks: Sequence[int]) -> list[int]:
        return [r for r in ranks if r != self.rank]

    @staticmethod
    def _like(received: torch.Tensor, template: torch.Tensor | None, what: str) -> torch.Tensor:
        """Received data in the template's shape and device, as torch.distributed fills a buffer.

        Like gloo, only the element count and dtype must agree (CrypTen sends a 0-d seed into
        a 1-element buffer).
        """
        if template is None:
            return received
        if received.numel() != template.numel() or received.dtype != template.dtype:
            raise ProtocolDesync(
                f"{what}: received {received.dtype}{list(received.shape)}, "
                f"expected {template.dtype}{list(template.shape)}"
            )
        return received.reshape(template.shape).to(template.device)

    def _post_all(self, dsts: Sequence[int], op: str, tensors: Sequence[Any], kind: int, deadline: float) -> list:
        ep = self.endpoint
        return [ep.post(d, op, t, kind=kind, deadline=deadline) for d, t in zip(dsts, tensors)]

    def _exchange(self, ranks: Sequence[int], op: str, tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        """Send every tensor to every other member of ``ranks``; return per-rank lists (own included)."""
        ep = self.endpoint
        deadline = ep.deadline()
        others = self._others(ranks)
        futures = [ep.post(r, op, t, kind=TENSOR, deadline=deadline) for t in tensors for r in others]
        tickets = {r: [ep.expect(r, op, TENSOR) for _ in tensors] for r in others}
        out: dict[int, list[torch.Tensor]] = {self.rank: list(tensors)}
        for r in others:
            out[r] = [
                self._like(ep.tensor_of(ep.collect(tk, deadline)), t, f"{op} from rank {r}")
                for tk, t in zip(tickets[r], tensors)
            ]
        ep.wait_all(futures, deadline)
        return [out[r] for r in ranks]

    # ------------------------------------------------------------------ point to point

    @_counted
    def send(self, tensor: torch.Tensor, dst: int) -> None:
        ep = self.endpoint
        ep.send(dst, "p2p", tensor.data, kind=TENSOR, deadline=ep.deadline())

    @_counted
    def recv(self, tensor: torch.Tensor, src: int | None = None) -> torch.Tensor:
        if src is None:
            raise ValueError("recv from any source is not supported: message keys need the source rank")
        ep = self.endpoint
        got = ep.recv_tensor(src, "p2p", ep.deadline())
        return self._like(got, tensor, f"recv from rank {src}")

    @_counted
    def isend(self, tensor: torch.Tensor, dst: int) -> _Request:
        ep = self.endpoint
        deadline = ep.deadline()
        fut = ep.post(dst, "p2p", tensor.data, kind=TENSOR, deadline=deadline)
        return _Request(self, lambda: ep.wait_all([fut], deadline))

    @_counted
    def irecv(self, tensor: torch.Tensor, src: int | None = None) -> _Request:
        """Like torch.distributed.irecv: ``wait()`` fills ``tensor`` in place."""
        if src is None:
            raise ValueError("irecv from any source is not supported: message keys need the source rank")
        ep = self.endpoint
        ticket = ep.expect(src, "p2p", TENSOR)

        def finish() -> None:
            got = ep.tensor_of(ep.collect(ticket, ep.deadline()))
            tensor.data.copy_(self._like(got, tensor.data, f"irecv from rank {src}"))

        return _Request(self, finish)

    # ------------------------------------------------------------------ collectives

    @_counted
    def scatter(
        self, scatter_list: list[torch.Tensor], src: int, size: Any = None, device: Any = None
    ) -> torch.Tensor:
        ep = self.endpoint
        deadline = ep.deadline()
        ranks = self._group(None)
        if self.rank == src:
            others = self._others(ranks)
            futures = self._post_all(others, "scatter", [scatter_list[r].data for r in others], TENSOR, deadline)
            ep.wait_all(futures, deadline)
            return scatter_list[self.rank]
        got = ep.recv_tensor(src, "scatter", deadline)
        if size is not None and got.shape != torch.Size(size):
            raise ProtocolDesync(f"scatter from rank {src}: got shape {list(got.shape)}, expected {list(size)}")
        if device is None and scatter_list:
            device = scatter_list[self.rank].device
        return got.to(device) if device is not None else got

    @_counted
    def reduce(self, input: Any, dst: int, op: Any = ReduceOp.SUM, batched: bool = False) -> Any:
        fn = _reduce_fn(op)
        tensors = list(input) if batched else [input]
        ep = self.endpoint
        deadline = ep.deadline()
        ranks = self._group(None)
        if self.rank != dst:
            ep.wait_all(self._post_all([dst] * len(tensors), "reduce", [t.data for t in tensors], TENSOR, deadline),
                        deadline)
            return None
        tickets = {r: [ep.expect(r, "reduce", TENSOR) for _ in tensors] for r in self._others(ranks)}
        per_rank = {self.rank: [t.data for t in tensors]}
        for r, tks in tickets.items():
            per_rank[r] = [self._like(ep.tensor_of(ep.collect(tk, deadline)), t.data, f"reduce from rank {r}")
                           for tk, t in zip(tks, tensors)]
        result = [functools.reduce(fn, [per_rank[r][i] for r in ranks]) for i in range(len(tensors))]
        return result if batched else result[0]

    @_counted
    def all_reduce(self, input: Any, op: Any = ReduceOp.SUM, batched: bool = False) -> Any:
        fn = _reduce_fn(op)
        tensors = [t.data for t in (input if batched else [input])]
        ranks = self._group(None)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        if len(ranks) >= 3 and nbytes >= SCATTERED_ALL_REDUCE_BYTES:
            return self._scattered_all_reduce(ranks, tensors, fn, batched)
        per_rank = self._exchange(ranks, "all_reduce", tensors)
        result = [functools.reduce(fn, [pr[i] for pr in per_rank]) for i in range(len(tensors))]
        self._opened(result)
        return result if batched else result[0]

    def _scattered_all_reduce(
        self, ranks: Sequence[int], tensors: list[torch.Tensor], fn: Callable[..., torch.Tensor], batched: bool
    ) -> Any:
        """Reduce-scatter then all-gather, one round each: member j reduces part j of every tensor
        (in rank order) and sends the result to all. Each party sends 2(P-1)/P·n bytes instead of
        the (P-1)·n of all-to-all, for one extra round; results are identical everywhere."""
        ep = self.endpoint
        deadline = ep.deadline()
        me = ranks.index(self.rank)
        others = self._others(ranks)
        parts = [list(torch.tensor_split(t.reshape(-1), len(ranks))) for t in tensors]
        futures = [
            ep.post(r, "all_reduce/scatter", parts[i][ranks.index(r)], kind=TENSOR, deadline=deadline)
            for i in range(len(tensors))
            for r in others
        ]
        tickets = {r: [ep.expect(r, "all_reduce/scatter", TENSOR) for _ in tensors] for r in others}
        mine = []
        for i in range(len(tensors)):
            pieces = []
            for r in ranks:
                if r == self.rank:
                    pieces.append(parts[i][me])
                else:
                    got = ep.tensor_of(ep.collect(tickets[r][i], deadline))
                    pieces.append(self._like(got, parts[i][me], f"all_reduce from rank {r}"))
            mine.append(functools.reduce(fn, pieces))
        ep.wait_all(futures, deadline)
        gathered = self._exchange_parts(ranks, "all_reduce/gather", mine, parts, deadline)
        result = [torch.cat(gathered[i]).reshape(t.shape) for i, t in enumerate(tensors)]
        self._opened(result)
        return result if batched else result[0]

    def _exchange_parts(
        self,
        ranks: Sequence[int],
        op: str,
        mine: list[torch.Tensor],
        parts: list[list[torch.Tensor]],
        deadline: float,
    ) -> list[list[torch.Tensor]]:
        """All-gather of each member's reduced part; returns, per tensor, the parts in rank order."""
        ep = self.endpoint
        others = self._others(ranks)
        futures = [ep.post(r, op, m, kind=TENSOR, deadline=deadline) for m in mine for r in others]
        tickets = {r: [ep.expect(r, op, TENSOR) for _ in mine] for r in others}
        out: list[list[torch.Tensor]] = []
        for i, m in enumerate(mine):
            row = []
            for j, r in enumerate(ranks):
                if r == self.rank:
                    row.append(m)
                else:
                    got = ep.tensor_of(ep.collect(tickets[r][i], deadline))
                    row.append(self._like(got, parts[i][j], f"{op} from rank {r}"))
            out.append(row)
        ep.wait_all(futures, deadline)
        return out

    @_counted
    def gather(self, tensor: torch.Tensor, dst: int) -> list[torch.Tensor | None]:
        ep = self.endpoint
        deadline = ep.deadline()
        ranks = self._group(None)
        if self.rank != dst:
            ep.send(dst, "gather", tensor.data, kind=TENSOR, deadline=deadline)
            return [None]
        tickets = {r: ep.expect(r, "gather", TENSOR) for r in self._others(ranks)}
        out: list[torch.Tensor | None] = []
        for r in ranks:
            if r == self.rank:
                out.append(tensor.data)
            else:
                got = ep.tensor_of(ep.collect(tickets[r], deadline))
                out.append(self._like(got, tensor.data, f"gather from rank {r}"))
        return out

    @_counted
    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        return [pr[0] for pr in self._exchange(self._group(None), "all_gather", [tensor.data])]

    @_counted
    def broadcast(self, input: Any, src: int, group: Group | None = None, batched: bool = False) -> Any:
        """In place, like torch.distributed.broadcast (CrypTen's TTP client relies on that)."""
        tensors = list(input) if batched else [input]
        ep = self.endpoint
        deadline = ep.deadline()
        ranks = self._group(group)
        if self.rank == src:
            others = self._others(ranks)
            futures = [ep.post(r, "broadcast", t.data, kind=TENSOR, deadline=deadline) for t in tensors for r in others]
            ep.wait_all(futures, deadline)
            return input
        tickets = [ep.expect(src, "broadcast", TENSOR) for _ in tensors]
        for tk, t in zip(tickets, tensors):
            got = ep.tensor_of(ep.collect(tk, deadline))
            t.data.copy_(self._like(got, t.data, f"broadcast from rank {src}"))
        return input

    @_counted
    def barrier(self) -> None:
        ep = self.endpoint
        deadline = ep.deadline()
        others = self._others(self._group(None))
        futures = [ep.post(r, "barrier", None, kind=TOKEN, deadline=deadline) for r in others]
        for r in others:
            ep.recv_token(r, "barrier", deadline)
        ep.wait_all(futures, deadline)

    # ------------------------------------------------------------------ objects (no pickle)

    @_counted
    def send_obj(self, obj: Any, dst: int, group: Group | None = None) -> None:
        self._group(group)
        ep = self.endpoint
        ep.send(dst, "obj", obj, kind=OBJECT, deadline=ep.deadline())

    @_counted
    def recv_obj(self, src: int, group: Group | None = None) -> Any:
        self._group(group)
        ep = self.endpoint
        return ep.recv_object(src, "obj", ep.deadline())

    @_counted
    def broadcast_obj(self, obj: Any, src: int, group: Group | None = None) -> Any:
        ep = self.endpoint
        deadline = ep.deadline()
        ranks = self._group(group)
        if self.rank == src:
            if obj is None:
                raise ValueError("src party must provide obj for broadcast")
            others = self._others(ranks)
            ep.wait_all(self._post_all(others, "broadcast_obj", [obj] * len(others), OBJECT, deadline), deadline)
            return obj
        return ep.recv_object(src, "broadcast_obj", deadline)


# ---------------------------------------------------------------------- hooking CrypTen


def _install_hooks() -> None:
    """Route ``crypten.communicator.{get,_init,is_initialized,uninit}`` to us when we are active."""
    mod = crypten.communicator
    if getattr(mod, "_mpc_erm_grpc_hooked", False):
        return
    orig_get, orig_init, orig_is_init, orig_uninit = mod.get, mod._init, mod.is_initialized, mod.uninit

    def get() -> Any:
        inst = GrpcCommunicator.instance
        return inst if inst is not None else orig_get()

    def _init(use_threads: bool, rank: int = 0, world_size: int = 1, init_ttp: bool = False) -> None:
        if GrpcCommunicator._pending is not None:
            GrpcCommunicator.initialize(rank, world_size, init_ttp=init_ttp)
        else:
            orig_init(use_threads, rank=rank, world_size=world_size, init_ttp=init_ttp)

    def is_initialized() -> bool:
        return GrpcCommunicator.instance is not None or orig_is_init()

    def uninit() -> None:
        if GrpcCommunicator.instance is not None:
            GrpcCommunicator.shutdown()
        else:
            orig_uninit()

    mod.get, mod._init, mod.is_initialized, mod.uninit = get, _init, is_initialized, uninit
    mod._mpc_erm_grpc_hooked = True


def init_crypten(
    table: PartyTable,
    me: str | int,
    identity: Identity,
    *,
    server: TransportServer | None = None,
    options: TransportOptions | None = None,
    config_file: str | None = None,
    connect: bool = True,
) -> GrpcCommunicator:
    """``crypten.init`` for one member of ``table`` over the gRPC transport.

    ``me`` is this member's name or rank; ``identity`` its TLS identity (must match the table).
    ``server``: an already running TransportServer to register the job with (the party daemon's);
    without one, a server is started on this member's table address. ``connect`` waits until
    every peer is reachable before CrypTen's first message (seed exchange).
    """
    rank = me if isinstance(me, int) else table.rank_of(me)
    member = table.member(rank)
    if (member.role, member.name) != (identity.role, identity.name):
        raise ValueError(f"identity {identity.role}/{identity.name} is not rank {rank} ({member.role}/{member.name})")
    _install_hooks()
    if crypten.communicator.is_initialized():
        raise TransportError("CrypTen is already initialised in this process (one MPC session per process)")
    GrpcCommunicator._pending = _Pending(table, rank, identity, server, options or TransportOptions(), connect)
    try:
        crypten.init(config_file=config_file, party_name=member.name)
    except BaseException:
        GrpcCommunicator.shutdown()
        raise
    finally:
        GrpcCommunicator._pending = None
    inst = GrpcCommunicator.instance
    assert inst is not None
    return inst


def uninit_crypten() -> None:
    """Shut the communicator down (closes this member's mailbox and channels)."""
    if GrpcCommunicator.instance is not None:
        crypten.uninit()
