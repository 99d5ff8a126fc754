"""Run one MPC function in every party of a throw-away job on this machine: real processes,
real gRPC + mutual TLS on loopback, the same set-up a deployment does.

:func:`run_local` is what benchmarks, examples and integration tests use instead of copying the
set-up: it starts (a ``multiprocessing`` *forkserver* whose server has only imported torch and
CrypTen: CrypTen keeps global state, one MPC session per process) one process per party, plus a
dealer process where the trust model needs one, creates a fresh in-memory CA and one certificate
per member, starts a ``TransportServer`` per member on ``127.0.0.1:0``, builds the
:class:`PartyTable` from the ports the members announce, runs ``init_crypten`` and the dealer
client, and then calls the picklable module-level function ``fn(ctx, *args)`` in every party
(SPMD, as all CrypTen code is). ``ctx`` is a :class:`LocalContext` (rank, world size, the
GrpcCommunicator, the trust model). The parties' return values (plain picklable data: numbers,
strings, numpy arrays, small tensors) come back as a list in rank order. Teardown is the
ordinary one (barrier, ``stop_dealer_client``, ``uninit_crypten``, ``server.stop``); on an error
or the overall timeout every process is killed and :class:`LocalRunError` carries the failing
member's traceback.

Trust models (``trust=``):

* ``"dealer"`` (default): additive sharing, every Beaver/binary triple, wrap and B2A pair from
  the dealer (a non-colluding third party; ``mpc_erm.mpc.dealer``). Starts M + 1 processes.
* ``"replicated"``: CrypTen's 3-party replicated sharing (honest majority) hardened with
  :func:`~mpc_erm.mpc.dealer.harden_crypten_rss`, ``cfg.mpc.protocol = "replicated"``. Exactly 3
  parties, no dealer. Arithmetic products need no triples; the binary triples and B2A bits that
  CrypTen 0.4.1 still asks its provider for (docs/explanation/crypten-findings.md item 3) come from
  :class:`~mpc_erm.mpc.rss_provider.ReplicatedProvider`, made by the three parties under RSS.
* ``"tfp"``: CrypTen's default provider, party 0 generates every triple and could unmask every
  product. TESTS AND BENCHMARKS ONLY; its trust model says so.

:func:`run_processes` is the bare supervisor underneath (start, collect, kill, tracebacks) for
code that sets its own communicator up, e.g. the CrypTen-over-gloo baseline of
``benchmarks/aggregate.py``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import secrets
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "TRUST_MODELS",
    "LocalContext",
    "LocalRun",
    "LocalRunError",
    "forkserver_context",
    "run_local",
    "run_local_full",
    "run_processes",
]

TRUST_MODELS = ("dealer", "replicated", "tfp")
TFP_LABEL = "run_local trust='tfp': tests and benchmarks only"
_KILL_GRACE_S = 5.0
_ERROR_SETTLE_S = 0.5  # after the first error, how long to listen for the others' (for the message)


class LocalRunError(RuntimeError):
    """A member failed, died or did not finish in time; ``str()`` holds its traceback.

    ``summary`` is one line (member and exception), ``member`` its description, ``tracebacks``
    every child traceback received (member -> text), first failure first.
    """

    def __init__(self, summary: str, *, member: str | None = None, tracebacks: dict[str, str] | None = None) -> None:
        self.summary = summary
        self.member = member
        self.tracebacks = dict(tracebacks or {})
        text = summary
        for who, tb in self.tracebacks.items():
            text += f"\n--- traceback of {who} ---\n{tb.rstrip()}"
        super().__init__(text)


@dataclass
class LocalContext:
    """What ``fn`` gets in each party."""

    rank: int
    world_size: int
    comm: Any  # mpc_erm.mpc.communicator.GrpcCommunicator
    trust: str  # "dealer" | "replicated" | "tfp"
    trust_model: str  # the sentence a report prints (mpc_erm.mpc.aggregator.current_trust_model)
    table: Any  # mpc_erm.mpc.transport.PartyTable
    name: str
    identity: Any = None  # this party's TLS identity (e.g. to serve clients of the same CA)


@dataclass
class LocalRun:
    """Everything one :func:`run_local_full` returns."""

    results: list[Any]  # fn's return value per party, rank order
    dealer: dict[str, Any] | None  # what the dealer served (requests per function), if one ran
    seconds: float  # wall time from start to the last result
    job_id: str


# ---------------------------------------------------------------------- supervisor


def _last_line(tb: str) -> str:
    lines = [ln for ln in tb.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "(no traceback)"


#: What the fork server of :func:`run_local`'s children imports once, so that each party does not
#: import torch and CrypTen again (5–6 s of CPU a process).
PRELOAD = ("torch", "numpy", "mpc_erm.mpc.communicator", "mpc_erm.mpc.dealer", "mpc_erm.mpc.rss_provider",
           "mpc_erm.mpc.local")


def forkserver_context(preload: Sequence[str] = PRELOAD) -> Any:
    """A multiprocessing context whose children fork from a fork server that has imported
    ``preload`` and nothing else: each starts from pristine module state (CrypTen never
    initialised there), as with *spawn*, without paying the imports. The server is this
    process's (Python's, process-wide): the first call starts it, with its list and the
    environment of that moment; a later list only matters if the server must start again."""
    mp.set_forkserver_preload(list(preload))
    return mp.get_context("forkserver")


class _Supervisor:
    """Forked children that post (kind, index, payload) on one queue; see :func:`_post`."""

    def __init__(self, names: Sequence[str]) -> None:
        self.ctx = forkserver_context()
        self.out_q = self.ctx.Queue()
        self.names = list(names)
        self.procs: list[Any] = []

    def start(self, target: Callable[..., None], args: tuple[Any, ...]) -> None:
        p = self.ctx.Process(target=target, args=args, daemon=True, name=f"mpc-local-{self.names[len(self.procs)]}")
        p.start()
        self.procs.append(p)

    def wait(self, kind: str, deadline: float, what: str) -> dict[int, Any]:
        """One ``kind`` message from every child (payloads by index); raise LocalRunError on a
        child error, a child that exits without posting, or the deadline."""
        got: dict[int, Any] = {}
        dead_since: dict[int, float] = {}
        while len(got) < len(self.procs):
            now = time.monotonic()
            if now >= deadline:
                silent = [self.names[i] for i in range(len(self.procs)) if i not in got]
                raise LocalRunError(f"timed out waiting for {what} from {', '.join(silent)}")
            try:
                k, i, payload = self.out_q.get(timeout=min(0.5, deadline - now))
            except queue.Empty:
                for i, p in enumerate(self.procs):
                    if i in got or p.exitcode is None:
                        continue
                    # Exited: its last message may still be in the pipe; give it a moment.
                    first = dead_since.setdefault(i, time.monotonic())
                    if time.monotonic() - first > 2.0:
                        raise LocalRunError(
                            f"{self.names[i]} exited with code {p.exitcode} before sending its {what}",
                            member=self.names[i],
                        ) from None
                continue
            if k == "error":
                self._raise_error(i, payload)
            if k != kind:
                raise LocalRunError(f"{self.names[i]} sent {k!r} while {what} was expected", member=self.names[i])
            got[i] = payload
        return got

    def _raise_error(self, i: int, tb: str) -> None:
        errors = {self.names[i]: tb}
        end = time.monotonic() + _ERROR_SETTLE_S
        while time.monotonic() < end:
            try:
                k, j, payload = self.out_q.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                break
            if k == "error":
                errors.setdefault(self.names[j], payload)
        raise LocalRunError(f"{self.names[i]} failed: {_last_line(tb)}", member=self.names[i], tracebacks=errors)

    def close(self) -> None:
        """Join the children that are finishing; kill the rest."""
        end = time.monotonic() + _KILL_GRACE_S
        for p in self.procs:
            p.join(timeout=max(0.0, end - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=5.0)
        self.out_q.close()
        self.out_q.cancel_join_thread()

    def kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=5.0)
        self.out_q.close()
        self.out_q.cancel_join_thread()


def _post(out_q: Any, kind: str, index: int, payload: Any) -> None:
    """Pickle here (not in the queue's feeder thread) so an unpicklable result is an error with
    a traceback in this child, not a message silently dropped."""
    out_q.put((kind, index, pickle.dumps(payload) if kind == "result" else payload))


def _child_setup() -> None:
    import torch

    from .memory import limit_malloc_arenas

    limit_malloc_arenas()  # before gRPC's threads (mpc_erm.mpc.memory)
    torch.set_num_threads(1)


def _plain_main(fn: Callable[..., Any], index: int, count: int, args: tuple[Any, ...], out_q: Any) -> None:
    try:
        _child_setup()
        _post(out_q, "result", index, fn(index, count, *args))
    except BaseException:
        out_q.put(("error", index, traceback.format_exc()))
    _fast_exit(out_q)


def run_processes(
    fn: Callable[..., Any],
    processes: int,
    *,
    args: tuple[Any, ...] = (),
    timeout_s: float = 600.0,
    names: Sequence[str] | None = None,
) -> list[Any]:
    """Spawn ``processes`` children running ``fn(index, processes, *args)`` (module-level,
    picklable) with ``torch.set_num_threads(1)``; return their results in index order.

    Any child's exception kills the others and raises :class:`LocalRunError` with its traceback.
    """
    if processes < 1:
        raise ValueError("processes must be positive")
    names = list(names) if names is not None else [f"process {i}" for i in range(processes)]
    sup = _Supervisor(names)
    ok = False
    try:
        for i in range(processes):
            sup.start(_plain_main, (fn, i, processes, tuple(args), sup.out_q))
        got = sup.wait("result", time.monotonic() + timeout_s, "result")
        ok = True
        return [pickle.loads(got[i]) for i in range(processes)]
    finally:
        sup.close() if ok else sup.kill()


# ---------------------------------------------------------------------- run_local


def _member_main(
    index: int,
    role: str,
    identity: Any,
    trust: str,
    fn: Callable[..., Any] | None,
    args: tuple[Any, ...],
    deadline_s: float,
    table_q: Any,
    out_q: Any,
    table_timeout_s: float,
) -> None:
    server = None
    try:
        _child_setup()
        from .transport import TransportOptions, TransportServer

        server = TransportServer(identity, "127.0.0.1:0")
        out_q.put(("port", index, server.start()))
        table = table_q.get(timeout=table_timeout_s)
        options = TransportOptions(deadline_s=deadline_s)
        if role == "dealer":
            from .dealer import run_dealer

            rep = run_dealer(table, identity, server=server, options=options)
            result: Any = {
                "requests": rep.requests,
                "by_function": dict(rep.by_function),
                "elements_served": rep.elements_served,
                "ended_by": rep.ended_by,
            }
        else:
            assert fn is not None
            result = _party_main(index, table, identity, server, options, trust, fn, args)
        _post(out_q, "result", index, result)
    except BaseException:
        out_q.put(("error", index, traceback.format_exc()))
    finally:
        if server is not None:
            try:
                server.stop(0.5)
            except Exception:  # best effort at exit
                pass
    _fast_exit(out_q)


def _fast_exit(out_q: Any) -> None:
    """Everything is closed and reported: flush the report and leave without the interpreter's
    finalisation (seconds of torch/gRPC module teardown on a loaded box, nothing to save)."""
    try:
        out_q.close()
        out_q.join_thread()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # best effort
                pass
        os._exit(0)


def _party_main(
    rank: int, table: Any, identity: Any, server: Any, options: Any, trust: str, fn: Callable[..., Any],
    args: tuple[Any, ...],
) -> Any:
    from .aggregator import current_trust_model
    from .agreement import check_setup
    from .communicator import init_crypten, uninit_crypten
    from .crypten_compat import import_crypten
    from .dealer import harden_crypten_rss, start_dealer_client, stop_dealer_client

    import_crypten()
    from crypten.config import cfg

    if trust == "replicated":
        cfg.mpc.protocol = "replicated"
        harden_crypten_rss()  # before the first product, in every party
    else:
        cfg.mpc.protocol = "beaver"
    cfg.mpc.provider = "TFP"  # CrypTen's default; the dealer client switches it to "DEALER"
    comm = init_crypten(table, rank, identity, server=server, options=options)
    dealer = table.dealer is not None
    try:
        if dealer:
            start_dealer_client(comm)
        elif trust == "replicated":
            from .rss_provider import start_replicated_provider

            start_replicated_provider()
        check_setup(comm)
        trust_model = current_trust_model(table.dealer.name if dealer else None)
        if trust == "tfp":
            trust_model = f"{trust_model} [{TFP_LABEL}]"
        ctx = LocalContext(rank=rank, world_size=comm.get_world_size(), comm=comm, trust=trust,
                           trust_model=trust_model, table=table, name=table.member(rank).name, identity=identity)
        result = fn(ctx, *args)
        comm.barrier()  # everyone done before party 0 ends the dealer and mailboxes close
    except BaseException:
        try:
            stop_dealer_client(send_terminate=False)
            uninit_crypten()
        except Exception:  # the original error is what matters
            pass
        raise
    stop_dealer_client()
    uninit_crypten()
    return result


def run_local_full(
    fn: Callable[..., Any],
    *,
    parties: int = 3,
    trust: str = "dealer",
    args: tuple[Any, ...] = (),
    timeout_s: float = 600.0,
    deadline_s: float = 60.0,
    job_id: str | None = None,
    ca: Any = None,
) -> LocalRun:
    """:func:`run_local`, also returning the dealer's summary and the wall time. ``ca``: the CA
    that issues the members' identities (default: a fresh one), e.g. to issue clients of them."""
    if trust not in TRUST_MODELS:
        raise ValueError(f"trust must be one of {', '.join(TRUST_MODELS)}, not {trust!r}")
    if parties < 1:
        raise ValueError("parties must be at least 1")
    if trust == "replicated" and parties != 3:
        raise ValueError(f"trust 'replicated' (CrypTen's 3-party replicated sharing): parties must be 3, not {parties}")
    if not (timeout_s > 0 and deadline_s > 0):
        raise ValueError("timeout_s and deadline_s must be positive")
    from . import pki
    from .transport.table import Member, PartyTable

    tic = time.monotonic()
    deadline = tic + timeout_s
    job = job_id or f"local-{os.getpid()}-{secrets.token_hex(4)}"
    with_dealer = trust == "dealer"
    names = [f"party{r}" for r in range(parties)] + (["dealer"] if with_dealer else [])
    roles = ["party"] * parties + (["dealer"] if with_dealer else [])
    ca = ca or pki.create_ca(f"mpc-erm local CA {job}")
    identities = [pki.issue_identity(ca, n, r) for n, r in zip(names, roles)]  # type: ignore[arg-type]
    described = [f"{r} {i} {n!r}" for i, (n, r) in enumerate(zip(names, roles))]
    sup = _Supervisor(described)
    table_qs = [sup.ctx.Queue() for _ in names]
    ok = False
    try:
        for i, (role, ident) in enumerate(zip(roles, identities)):
            sup.start(_member_main, (i, role, ident, trust, fn if role == "party" else None, tuple(args),
                                     deadline_s, table_qs[i], sup.out_q, timeout_s))
        ports = sup.wait("port", deadline, "port announcement")
        table = PartyTable(
            job_id=job,
            parties=tuple(Member(names[r], f"127.0.0.1:{ports[r]}", "party") for r in range(parties)),
            dealer=Member("dealer", f"127.0.0.1:{ports[parties]}", "dealer") if with_dealer else None,
        )
        for q in table_qs:
            q.put(table)
        got = sup.wait("result", deadline, "result")
        ok = True
    finally:
        sup.close() if ok else sup.kill()
        for q in table_qs:
            q.close()
            q.cancel_join_thread()
    results = [pickle.loads(got[r]) for r in range(parties)]
    dealer_rep = pickle.loads(got[parties]) if with_dealer else None
    return LocalRun(results=results, dealer=dealer_rep, seconds=time.monotonic() - tic, job_id=job)


def run_local(
    fn: Callable[..., Any],
    *,
    parties: int = 3,
    trust: str = "dealer",
    args: tuple[Any, ...] = (),
    timeout_s: float = 600.0,
    deadline_s: float = 60.0,
) -> list[Any]:
    """Run ``fn(ctx, *args)`` in ``parties`` CrypTen parties over gRPC + mTLS on loopback.

    ``fn`` must be a module-level function (it is pickled by reference into the child processes)
    and return plain picklable data. ``trust``: ``"dealer"`` (default; M + 1 processes),
    ``"replicated"`` (3 parties, hardened RSS for products, no dealer: comparisons' binary triples
    and B2A bits from :class:`~mpc_erm.mpc.rss_provider.ReplicatedProvider`)
    or ``"tfp"`` (party 0 makes the triples: tests and benchmarks only, and labelled so in
    ``ctx.trust_model``). ``timeout_s`` bounds the whole run (start to last result);
    ``deadline_s`` bounds every communicator operation inside it.

    Returns fn's results in rank order. Raises :class:`LocalRunError` (child traceback included)
    if a member fails, exits early or the run exceeds ``timeout_s``; all processes are killed.
    """
    return run_local_full(fn, parties=parties, trust=trust, args=args, timeout_s=timeout_s,
                          deadline_s=deadline_s).results
