"""A data owner's ``owner join`` killed mid-job (issue 17): its reservation must not stay open.

Real processes hold a job's run lock and its ledger reservation, as ``run_owner_job`` does, and are
SIGKILLed. The next ``owner join`` settles what they left: a job that had marked a round revealed
stays charged the rounds it marked (committed), one that revealed nothing is released, and a job
another live process is running is left alone.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from types import SimpleNamespace

from mpc_erm.privacy.events import GaussianRounds
from parties.ledger import Ledger
from parties.owner.process import settle_abandoned
from tests.procs import preloaded_context

BUDGETS = {"clinics": (50.0, 1e-4, "add_remove")}
EVENT = GaussianRounds(rounds=10, adjacency="add_remove", sampler_tv=0.0, noise_multiplier=2.0)


def _hold_job(state: str, job_id: str, reveal_rounds: int, ready: object) -> None:
    import time

    from parties.owner.process import _job_lock

    lock = _job_lock(Path(state), job_id, wait=False)
    assert lock is not None
    led = Ledger.in_state_dir(state, BUDGETS)
    led.reserve(job_id, "clinics", 1.0, 1e-6, "d" * 64, EVENT)
    if reveal_rounds:
        led.mark_revealed(job_id, EVENT, rounds=reveal_rounds)
    ready.set()  # type: ignore[attr-defined]
    time.sleep(600)


def test_a_killed_owner_join_is_settled_at_the_next_and_a_live_one_is_left_alone(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    ctx = preloaded_context()
    procs = {}
    for job_id, rounds in (("revealed", 3), ("never", 0), ("alive", 2)):
        ready = ctx.Event()
        p = ctx.Process(target=_hold_job, args=(state, job_id, rounds, ready), daemon=True)
        p.start()
        assert ready.wait(120), job_id
        procs[job_id] = p
    try:
        for job_id in ("revealed", "never"):
            os.kill(procs[job_id].pid, signal.SIGKILL)  # type: ignore[arg-type]
            procs[job_id].join(10)
        cfg = SimpleNamespace(state_dir=state)
        with Ledger.in_state_dir(state, BUDGETS) as led:
            assert settle_abandoned(cfg, led) == {"revealed": "committed", "never": "released"}  # type: ignore[arg-type]
            got = {j: led.get(j) for j in ("revealed", "never", "alive")}
            assert got["revealed"].state == "committed" and got["revealed"].revealed_rounds == 3  # type: ignore[union-attr]
            assert got["never"].state == "released"  # type: ignore[union-attr]
            assert got["alive"].state == "revealed"  # type: ignore[union-attr]  # its process still runs it
            assert 0 < led.spent("clinics")
        os.kill(procs["alive"].pid, signal.SIGKILL)  # type: ignore[arg-type]
        procs["alive"].join(10)
        with Ledger.in_state_dir(state, BUDGETS) as led:
            assert settle_abandoned(cfg, led) == {"alive": "committed"}  # type: ignore[arg-type]
            assert settle_abandoned(cfg, led) == {}  # nothing left open
    finally:
        for p in procs.values():
            if p.is_alive():
                p.kill()
