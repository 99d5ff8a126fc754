"""`mpc-erm job …` against real daemons (in-process, gRPC + mTLS, the stand-in worker of
tests/parties/test_daemon.py): what the coordinator's user reads after a cancel, a refusal, and
while watching a job."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from parties.config import load_party_config
from parties.daemon import PartyDaemon
from tests.parties import test_daemon
from tests.parties.test_daemon import FAKE, job_toml, status, stub, submit, wait_for, write_config

pki_dir = test_daemon.pki_dir  # the CA and identities (module-scoped fixtures)
stand_ins = test_daemon.stand_ins


def _cli(*args: str) -> Any:
    from coordinator.cli import cli

    return CliRunner().invoke(cli, list(args))


def _coordinator(tmp_path: Path, pki_dir: Path, parties: dict[str, int]) -> Path:
    path = tmp_path / "coordinator.toml"
    path.write_text("timeout_s = 30\n\n[identity]\nname = \"coord\"\n"
                    f"cert = \"{pki_dir / 'coord.crt'}\"\nkey = \"{pki_dir / 'coord.key'}\"\n"
                    f"ca = \"{pki_dir / 'ca.crt'}\"\n\n[parties]\n"
                    + "".join(f'{n} = "127.0.0.1:{port}"\n' for n, port in parties.items()))
    return path


@pytest.fixture
def alice(tmp_path: Path, pki_dir: Path, stand_ins: dict[str, tuple[str, str]]) -> Iterator[tuple[PartyDaemon, Path]]:
    """alice's daemon (bob, carol and the dealer stand-ins that agree to every job) and a
    coordinator config that knows only alice."""
    d = PartyDaemon(load_party_config(write_config(tmp_path, pki_dir, "alice", peers=stand_ins)), worker_module=FAKE,
                    cancel_grace_s=3.0, log_to_stderr=False)
    port = d.start()
    try:
        yield d, _coordinator(tmp_path, pki_dir, {"alice": port})
    finally:
        d.stop()


def test_cancel_prints_the_states_after_the_cancel(alice: tuple[PartyDaemon, Path], pki_dir: Path) -> None:
    """A running job's worker takes a moment to stop: the cancel's first answer is "running"; what
    the user must read is the state once the member ended the job."""
    d, coord = alice
    s = stub(pki_dir, d.port)  # type: ignore[arg-type]
    assert submit(s, "blocked", job_toml("block")).accepted  # runs until cancelled
    wait_for(lambda: status(s, "blocked") == "running", what="the job running")
    out = _cli("job", "cancel", "blocked", "--config", str(coord), "--reason", "changed my mind")
    assert out.exit_code == 0, out.output
    assert re.fullmatch(r"alice: cancelled \(cancelled by coord: changed my mind.*\)\n", out.output), out.output
    assert status(s, "blocked") == "cancelled"
    out = _cli("job", "cancel", "blocked", "--config", str(coord), "--json")  # already ended: its state at once
    assert out.exit_code == 0 and json.loads(out.output)["members"]["alice"]["status"] == "cancelled", out.output


def test_cancel_says_which_member_has_not_ended_within_the_wait(alice: tuple[PartyDaemon, Path],
                                                                pki_dir: Path) -> None:
    d, coord = alice
    s = stub(pki_dir, d.port)  # type: ignore[arg-type]
    assert submit(s, "stubborn1", job_toml("stubborn")).accepted  # ignores the cancel: killed after the grace (3 s)
    wait_for(lambda: status(s, "stubborn1") == "running", what="the job running")
    out = _cli("job", "cancel", "stubborn1", "--config", str(coord), "--wait", "0.5")
    assert out.exit_code == 1, out.output
    assert out.output == "alice: running; cancel requested, not ended after 0.5 s\n", out.output
    wait_for(lambda: status(s, "stubborn1") == "cancelled", what="the stubborn worker killed")


# --------------------------------------------------------------------------- watch: progress, time left, next step


def _events(job_id: str, t0: float, rounds_done: int, *, rounds: int = 100, step_s: float = 2.0,
            done: bool = False) -> list[dict[str, Any]]:
    """A job's events as the daemons stream them (their own clock): the parties train a round every
    ``step_s`` seconds from ``t0``; the dealer has no rounds."""
    evs: list[dict[str, Any]] = []
    for m in ("alice", "bob", "carol", "dealer"):
        evs.append({"member": m, "job_id": job_id, "seq": 1, "time": t0, "phase": "running",
                    "payload": {"message": "worker starting"}})
    for r in range(1, rounds_done + 1):
        for m in ("alice", "bob", "carol"):
            evs.append({"member": m, "job_id": job_id, "seq": r + 1, "time": t0 + step_s * r, "phase": "training",
                        "payload": {"round": r, "rounds": rounds, "epsilon_spent": 0.01 * r, "epoch": r / 10}})
    if done:
        for m in ("alice", "bob", "carol", "dealer"):
            evs.append({"member": m, "job_id": job_id, "seq": 10_000, "time": t0 + step_s * rounds + 1,
                        "phase": "succeeded", "payload": {"message": "succeeded", "summary": {}}})
    return evs


class _ReplayClient:
    """The coordinator client reduced to a recorded event stream (a watch that joins late gets the
    past events at once: the time left must come from their times, not from when they arrive)."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events

    def __enter__(self) -> _ReplayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def job_members(self, job_id: str) -> list[str]:
        return ["alice", "bob", "carol", "dealer"]

    def status(self, job_id: str) -> dict[str, Any]:
        return {m: {"status": "running"} for m in self.job_members(job_id)}

    def watch(self, job_id: str, *, members: list[str] | None = None) -> Iterator[dict[str, Any]]:
        yield from self.events


def _watch_with(monkeypatch: pytest.MonkeyPatch, events: list[dict[str, Any]], *args: str) -> Any:
    import sys

    from coordinator.cli import cli

    monkeypatch.setattr(sys.modules["coordinator.cli.job"], "_client", lambda _path: _ReplayClient(events))
    return CliRunner().invoke(cli, ["job", "watch", "abc", "--config", "coordinator.toml", *args],
                              env={"COLUMNS": "80"})


def test_member_progress_estimates_by_the_events_times() -> None:
    from coordinator.cli.job import MemberProgress

    p = MemberProgress()
    for ev in _events("j", 1000.0, 50):
        if ev["member"] == "alice":
            p.update(ev)
    assert (p.round, p.rounds, p.eps, p.epoch) == (50, 100, 0.5, 5.0)
    assert p.eta_s() == pytest.approx(100.0)  # 50 rounds left at 2 s a round, however fast they arrived
    assert p.left(1100.0 + 30) == pytest.approx(70.0) and p.elapsed(1130.0) == pytest.approx(130.0)
    p.update({"member": "alice", "time": 1201.0, "phase": "succeeded", "payload": {}})
    assert p.eta_s() is None and p.elapsed(5000.0) == pytest.approx(201.0) and p.round == 100


def test_watch_shows_each_member_and_its_time_left_in_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    out = _watch_with(monkeypatch, _events("abc", now - 100, 50))  # the streams break off mid-job
    lines = out.output.splitlines()
    table = [x for x in lines if x.split()[:1] in (["alice"], ["bob"], ["carol"], ["dealer"])]
    assert len(table) == 4 and max(map(len, table)) <= 80, "\n" + out.output  # a line each, none wrapped
    for m in ("alice", "bob", "carol"):
        line = next(x for x in lines if x.startswith(m))
        assert re.search(r"training .* 50/100 epoch 5\.00 ε spent 0\.5 1:4\d, 1:(39|40) left$", line.rstrip()), line
    assert re.search(r"^dealer +running .* 1:4\d, \? left", out.output, re.M), out.output  # no rounds: no estimate
    assert out.exit_code == 1 and "next:" not in out.output  # not finished: no result to fetch

    out = _watch_with(monkeypatch, _events("abc", now - 300, 100, done=True))
    assert out.exit_code == 0, out.output
    assert max(map(len, out.output.splitlines())) <= 80, "\n" + out.output
    for m in ("alice", "bob", "carol"):
        assert re.search(rf"^{m} +succeeded .* 100/100 epoch 10.00 ε spent 1 took 3:21$", out.output, re.M), out.output
    assert out.output.rstrip().endswith("next: mpc-erm job result abc --out results/abc --config coordinator.toml")


def test_watch_json_gives_the_time_left_with_each_round(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _watch_with(monkeypatch, _events("abc", 1000.0, 10, rounds=20, done=True), "--json")
    assert out.exit_code == 0, out.output
    evs = [json.loads(x) for x in out.output.splitlines()]
    rounds = [e for e in evs if e["phase"] == "training" and e["member"] == "bob"]
    assert "eta_s" not in rounds[0] and [e["eta_s"] for e in rounds[1:]] == [2.0 * (20 - r) for r in range(2, 11)]
    assert {e["member"] for e in evs if e["phase"] == "succeeded"} == {"alice", "bob", "carol", "dealer"}
