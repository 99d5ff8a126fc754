"""The contract between the party daemon and a job's worker process.

Why a separate process per job: CrypTen keeps global state (one MPC session per process), and
a crashed or cancelled job must not take the daemon down. The daemon (``parties.daemon``)
validates, reserves budget and spawns the worker; the worker (``parties.worker``) runs the MPC.
They talk only through this interface, implemented by the daemon over multiprocessing queues,
so the worker can be tested with an in-process implementation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from mpc_erm.jobs.jobfile import JobFile
from mpc_erm.mpc.pki import Identity

from .config import PartyConfig

__all__ = ["JobCancelled", "WorkerContext"]


class JobCancelled(RuntimeError):
    """Raised inside the worker when the daemon was asked to cancel the job."""


class WorkerContext(Protocol):
    """What a worker receives. All methods are safe to call from the worker process."""

    job_id: str
    job: JobFile
    config: PartyConfig  # this member's daemon config (a party's, or the dealer's)
    identity: Identity  # this member's TLS identity (certificate, key, CA)
    job_dir: Path  # state_dir/jobs/<job_id>: results go here (model, report, metrics, plot)
    ledger_path: Path | None  # the party's budget ledger (None in the dealer)

    def emit(self, event: dict[str, Any]) -> None:
        """Progress for ``job watch``: {"phase": str, "message": str, "round": int, "rounds": int,
        "epsilon_spent": float, ...} (JSON-serialisable; never data, shares, noise or keys)."""

    def publish_endpoint(self, address: str) -> None:
        """Tell the daemon where this worker's share transport listens ("host:port")."""

    def lookup_endpoint(self, member: str, timeout_s: float) -> str:
        """The transport address of ``member``'s worker for this job, asked of that member's daemon
        over mTLS; blocks until it is published or raises TimeoutError naming the member."""

    def cancelled(self) -> bool:
        """True once a cancel request for this job reached the daemon."""
