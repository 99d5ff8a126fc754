"""Shared by the tests that run real party processes: collect what each member reports, reap the
processes whatever happened, and surface any child's traceback as the test failure."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from typing import Any

import pytest
import torch

from tests.procs import preloaded_context


def tensors_from_numpy(report: dict[str, Any]) -> dict[str, Any]:
    """Children send numpy arrays through the queue (no torch pickling across processes)."""
    return {k: torch.from_numpy(v) if hasattr(v, "dtype") else v for k, v in report.items()}


def collect_reports(
    procs: Sequence[BaseProcess],
    out_q: Any,
    members: int,
    timeout: float,
    convert: Callable[[dict[str, Any]], dict[str, Any]] = tensors_from_numpy,
) -> dict[int, dict[str, Any]]:
    """Wait up to ``timeout`` s in all for one report per member (keyed by its "rank"), then join
    or kill every process; fail the test naming the silent members or with the children's errors."""
    reports: dict[int, dict[str, Any]] = {}
    end = time.monotonic() + timeout
    try:
        while len(reports) < members:
            rep = out_q.get(timeout=max(1.0, end - time.monotonic()))
            reports[rep["rank"]] = convert(rep)
    except queue.Empty:
        pytest.fail(f"members {sorted(set(range(members)) - set(reports))} did not report in time")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    errors = [r["error"] for r in reports.values() if "error" in r]
    assert not errors, "\n".join(errors)
    return reports


def start_parties(
    target: Callable[..., None], names: Sequence[str], job_id: str, ca_name: str
) -> tuple[list[BaseProcess], Any]:
    """Spawn one process per party running ``target(rank, identity, port_q, table_q, out_q)``: each
    announces its server port, then receives the job's party table. Returns (processes, out_q)."""
    from mpc_erm.mpc import pki
    from mpc_erm.mpc.transport import PartyTable

    ca = pki.create_ca(ca_name)
    identities = [pki.issue_identity(ca, name, "party") for name in names]
    ctx = preloaded_context()
    port_q, out_q = ctx.Queue(), ctx.Queue()
    table_qs = [ctx.Queue() for _ in names]
    procs = [
        ctx.Process(target=target, args=(r, identities[r], port_q, table_qs[r], out_q), daemon=True)
        for r in range(len(names))
    ]
    for p in procs:
        p.start()
    try:
        ports = dict(port_q.get(timeout=60) for _ in procs)
        table = PartyTable.from_pairs(job_id, [(n, f"127.0.0.1:{ports[r]}") for r, n in enumerate(names)])
        for q in table_qs:
            q.put(table)
    except queue.Empty:
        for p in procs:
            p.kill()
        pytest.fail("a party did not announce its port within the deadline")
    return procs, out_q


def join_as_party(rank: int, identity: Any, port_q: Any, table_q: Any, local_seed: int) -> tuple[Any, Any, Any]:
    """The child's half of :func:`start_parties`: one torch thread, a transport server whose port is
    announced, the job's table received, CrypTen initialised over gRPC with a 60 s deadline, and the
    ``local`` generator seeded with ``local_seed + rank`` and the ``global`` (public coins) one with
    ``local_seed`` at every party (fixed seeds: tests only, so a statistical test's p-value is the
    same on every run and machine; CrypTen would otherwise draw the public seed afresh at init).
    Returns (crypten, communicator, server); the caller uninitialises and stops them."""
    from mpc_erm.mpc.communicator import init_crypten
    from mpc_erm.mpc.crypten_compat import import_crypten
    from mpc_erm.mpc.transport import TransportOptions, TransportServer

    torch.set_num_threads(1)
    crypten = import_crypten()
    server = TransportServer(identity, "127.0.0.1:0")
    port_q.put((rank, server.start()))
    table = table_q.get(timeout=60)
    comm = init_crypten(table, identity.name, identity, server=server, options=TransportOptions(deadline_s=60))
    crypten.generators["local"][torch.device("cpu")].manual_seed(local_seed + rank)
    crypten.generators["global"][torch.device("cpu")].manual_seed(local_seed)
    return crypten, comm, server
