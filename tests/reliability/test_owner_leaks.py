"""What crosses a compute party's boundary in jobs with data owners (issue 17), on every path.

Three compute-party daemons (replicated sharing, no dealer; real processes, gRPC + mutual TLS on
loopback) run with the test-only recorder of ``tests/reliability/recording.py``, which now also
records, at each compute party's owner intake, every request an owner sent it (enrolment with its
keys, each round's shares, release reads) exactly as received, and the party's own plaintext (its
share sum, each published state). Twelve owners run in this test's process (``run_owner_job``, one
thread each, their own identities, ledgers and breast-cancer shards); what each owner hands to its
share client — its contribution v, the job's grid — is captured on the owner's side. Jobs, all
with in-MPC noise:

* a 3-round gradient job in which one owner leaves after its first round (a dropout),
* an output-perturbation job (one release of the owners' weighted local minimisers),
* the same with every owner sending and leaving (``owner join --leave``), then fetching the
  release that the compute parties' daemons keep (``owner fetch``, ``GetOwnerRelease``),
* a 2-round DP-Fed-LS job at τ = 0.5 (an owner not sampled sends shares of a zero update),
* the same with uniform sampling (exactly 6 of the 12 owners a round, drawn by the compute
  parties' secret shuffle, whose pair keys and masked messages now cross between them),
* a gradient job during which bob's daemon and worker are SIGKILLed after round 2 (an abort).

Checked on that one run (module fixture):

1. no message a compute party received from an owner, and no message between compute parties,
   holds an owner's contribution or a round's noise-free sum over the owners — as float64, float32,
   or int64 fixed point at CrypTen's 2^16 or the job's grid 2^g (single values and runs);
2. every explicit share a compute party received (zero updates included) is indistinguishable from
   uniform ring elements, while the same tests reject the owners' plaintext encodings;
3. no file a compute party wrote (logs, job store, audit log, job directory, results fetched by
   the coordinator) holds an owner's contribution or noise-free sum printed to 10+ digits or in
   binary, nor any owner's share key — the release kept for owners that left included;
4. after the abort nothing more is released: alice and carol publish no round after the kill and
   write no model, and every owner's run ends with an error.

Positive controls plant each kind of secret where the searches must find it.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from coordinator.consortium import LocalConsortium
from tests.parties.test_owner_jobs import FED_JOB, JOB, OUT_JOB, _run_owners, statuses

from .recording import NeedleSet, Record, read_records, start_recorded, uniformity
from .test_leaks import _add_vector, _haystack, _is_secret, _numbers

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.long]  # `make test-long` (CI runs it)

OWNERS = tuple(f"owner-{i:02d}" for i in range(12))
COMPUTE = ("alice", "bob", "carol")
LEAVES = 4  # leaves the gradient job after its first round
KILL_AFTER = 2  # rounds released in the killed job before bob is SIGKILLed
N_ROWS = 569  # breast_cancer rows over all owners (the public n̂ of the record-level jobs)
FINISHED = ("gradient", "output", "output_leave", "fed", "fed_uniform")  # the jobs that run to their end


@dataclass
class Sent:
    """One contribution as its owner handed it to the share client."""

    job: str
    owner: str
    t: int
    v: np.ndarray
    grid: int


@dataclass
class OwnerRun:
    root: Path
    cons_root: Path
    rec: Path
    jobs: dict[str, str] = field(default_factory=dict)  # name -> job id
    ends: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> compute party -> status
    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> owner -> summary or exception
    sent: list[Sent] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)  # every share key an owner sent at enrolment
    left: dict[str, Any] = field(default_factory=dict)  # output_leave: owner -> its join --leave summary


def _fetch_all(configs: list[Path], job_path: Path, job_id: str) -> dict[str, Any]:
    """Every owner's ``owner fetch`` of a job it left: name → summary, or the exception."""
    from mpc_erm.jobs.jobfile import load_job_file
    from parties.config import load_owner_config
    from parties.owner.process import fetch_owner_model

    job, out = load_job_file(job_path), {}
    for path in configs:
        cfg = load_owner_config(path)
        try:
            out[cfg.identity.name] = fetch_owner_model(cfg, job, job_id, wait_s=30)
        except Exception as exc:  # collected: the test asserts on them
            out[cfg.identity.name] = exc
    return out


def _capture_owners(mp: pytest.MonkeyPatch, r: OwnerRun) -> None:
    """Wrap the owners' share client in this process: record each contribution and each key."""
    from parties.owner.intake import OwnerClient

    lock = threading.Lock()
    seen: set[tuple[str, str, int]] = set()
    contribute, enroll = OwnerClient.contribute, OwnerClient.enroll

    def on_contribute(self: Any, t: int, v: Any, timeout_s: float = 30.0, **kw: Any) -> None:
        with lock:  # once per round: an owner early for a round sends the same shares again
            if (self.job_id, self.identity.name, t) not in seen:
                seen.add((self.job_id, self.identity.name, t))
                r.sent.append(Sent(self.job_id, self.identity.name, t, v.detach().double().numpy().copy(),
                                   int(self.frame.grid_bits)))
        return contribute(self, t, v, timeout_s, **kw)

    def on_enroll(self: Any, *args: Any, **kwargs: Any) -> Any:
        with lock:
            r.keys += [bytes(k) for k in self.sharer.keys.values()]
        return enroll(self, *args, **kwargs)

    mp.setattr(OwnerClient, "contribute", on_contribute)
    mp.setattr(OwnerClient, "enroll", on_enroll)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> OwnerRun:
    root = tmp_path_factory.mktemp("owner-leaks")
    site, rec = root / "site", root / "rec"
    r = OwnerRun(root=root, cons_root=root / "consortium", rec=rec)
    cons = LocalConsortium(r.cons_root, parties=3, dealer=False, max_epsilon_per_job=2.0, peer_timeout_s=10.0)
    cons.write()
    shard = {"format": "builtin", "name": "breast_cancer", "of": len(OWNERS), "epsilon": 5.0, "delta": 1e-4}
    configs = [cons.add_owner(o, {ds: {**shard, "part": i} for ds in ("grad", "out", "outl", "fed", "fedu", "killed")},
                              max_epsilon_per_job=2.0, root=root / "owners") for i, o in enumerate(OWNERS)]
    names = ", ".join(f'"{o}"' for o in OWNERS)
    jobs = {
        "gradient": JOB.format(dataset="grad", d=30, owners=names, no_noise="false", eps=1.0, n=N_ROWS, rounds=3),
        "output": OUT_JOB.format(dataset="out", d=30, owners=names, no_noise="false", eps=1.0, n=N_ROWS),
        "output_leave": OUT_JOB.format(dataset="outl", d=30, owners=names, no_noise="false", eps=1.0, n=N_ROWS),
        "fed": FED_JOB.format(dataset="fed", d=30, owners=names, no_noise="false", eps=2.0, n=len(OWNERS), rounds=2,
                              tau=0.5),
        "fed_uniform": FED_JOB.format(dataset="fedu", d=30, owners=names, no_noise="false", eps=2.0, n=len(OWNERS),
                                      rounds=2, tau=0.5) + 'sampling = "uniform"\n',
        "killed": JOB.format(dataset="killed", d=30, owners=names, no_noise="false", eps=1.0, n=N_ROWS, rounds=10),
    }

    def leave(i: int, t: int) -> None:
        if i == LEAVES:
            raise ConnectionAbortedError(f"{OWNERS[i]} leaves after round {t + 1}")

    def kill_bob(i: int, t: int) -> None:
        if i == 0 and t == KILL_AFTER - 1:
            cons.kill("bob")

    start_recorded(cons, site, rec)  # only the daemons (and their workers) record
    try:
        with pytest.MonkeyPatch.context() as mp:
            _capture_owners(mp, r)
            for name, text in jobs.items():
                path = root / f"{name}.toml"
                path.write_text(text)
                with cons.client() as client:
                    r.jobs[name] = job_id = client.submit(path)["job_id"]
                on_round = {"gradient": leave, "killed": kill_bob}.get(name, lambda i, t: None)
                r.outcomes[name] = _run_owners(configs, path, job_id, on_round=on_round, wait_s=30,
                                               leave=name == "output_leave")
                alive = COMPUTE if name != "killed" else ("alice", "carol")
                r.ends[name] = statuses(cons, job_id, alive)
                if name == "output_leave":  # each owner fetches its model from the daemons' kept release
                    r.left = dict(r.outcomes[name])
                    r.outcomes[name] = _fetch_all(configs, path, job_id)
                if name != "killed":
                    with cons.client() as client:
                        client.result(job_id, root / "results" / name)
    finally:
        cons.stop()
    return r


@dataclass
class Seen:
    owner_in: list[Record]  # every owner request a compute party received
    transport: list[Record]  # every message between compute parties (sent side)
    plain: list[Record]  # the compute parties' own plaintext (share sums, published states, noise shares)


@pytest.fixture(scope="module")
def seen(run: OwnerRun) -> Seen:
    recs = list(read_records(run.rec))
    return Seen([x for x in recs if x.dir == "owner_in"], [x for x in recs if x.dir == "sent"],
                [x for x in recs if x.dir == "plain"])


def _exact_sums(run: OwnerRun) -> list[tuple[str, int, np.ndarray, int]]:
    """(job, round, Σ v over the owners who sent, grid): each round's noise-free sum (at least the
    part the compute parties could have agreed on: every sender)."""
    by: dict[tuple[str, int], list[Sent]] = {}
    for s in run.sent:
        by.setdefault((s.job, s.t), []).append(s)
    return [(j, t, np.sum([s.v for s in ss], axis=0), ss[0].grid) for (j, t), ss in sorted(by.items())]


@pytest.fixture(scope="module")
def needles(run: OwnerRun) -> NeedleSet:
    ns = NeedleSet()
    for s in run.sent:
        if np.any(s.v != 0):  # a zero update has nothing to find (its shares are tested for uniformity)
            _add_vector(ns, f"contribution[{s.owner}]", s.v, s.grid)
    for job, t, total, g in _exact_sums(run):
        _add_vector(ns, f"owners_sum[{job[:6]}:{t}]", total, g)
    return ns


def _explicit_shares(seen: Seen, keep: Any = lambda meta: True) -> np.ndarray:
    """The explicit shares the compute parties received, one per (job, owner, round) — an owner
    early for a round sends the same bytes again — of the requests ``keep(meta)`` selects."""
    from mpc_erm.mpc._proto import owner_pb2 as pb

    once: dict[tuple[str, str, int], bytes] = {}
    for x in seen.owner_in:
        if x.meta["kind"] == "contribute" and keep(x.meta):
            share = pb.ContributeRequest.FromString(x.payload).share
            if share:
                once[(x.meta["job"], x.meta["owner"], x.meta["round"])] = share
    return np.frombuffer(b"".join(once.values()), dtype="<i8")


# ===================================================================================== the jobs


def test_the_jobs_ran_as_planned(run: OwnerRun, seen: Seen) -> None:
    for name in FINISHED:
        assert run.ends[name] == dict.fromkeys(COMPUTE, "succeeded"), (name, run.ends[name])
    left = run.outcomes["gradient"].pop(OWNERS[LEAVES])
    assert isinstance(left, ConnectionAbortedError), left
    for name in FINISHED:
        bad = {o: v for o, v in run.outcomes[name].items() if not isinstance(v, dict)}
        assert not bad, (name, bad)
    assert {v["status"] for v in run.left.values()} == {"sent"}, run.left  # every owner left after sending
    assert {v["status"] for v in run.outcomes["output_leave"].values()} == {"done"}
    kept = [run.cons_root / p / "state" / "jobs" / run.jobs["output_leave"] / ".owners" for p in COMPUTE]
    assert all(any(k.iterdir()) for k in kept), kept  # the release kept for them (scanned in 3. below)
    fed = run.jobs["fed"]
    zero = [s for s in run.sent if s.job == fed and not np.any(s.v)]
    assert zero and len(zero) < len(OWNERS) * 2, len(zero)  # some owners were not sampled, some were
    uniform = [s for s in run.sent if s.job == run.jobs["fed_uniform"]]  # everyone sends, exactly 6 ran epochs
    assert len(uniform) == len(OWNERS) * 2 and sum(1 for s in uniform if np.any(s.v)) == 6 * 2, len(uniform)
    kinds = {(x.meta["job"], x.meta["kind"]) for x in seen.owner_in}
    for job_id in run.jobs.values():
        assert {(job_id, "enroll"), (job_id, "contribute")} <= kinds
    # a compute party reads no data set of its own in these jobs: nothing reserved, nothing to settle
    for name in COMPUTE:
        log = (run.cons_root / name / "state" / "daemon.log").read_text()
        assert "job succeeded" in log and "ledger: " not in log, [x for x in log.splitlines() if "ledger: " in x][:2]
    # every contribution of a job that ran to its end reached its explicit compute party, in full
    done = {run.jobs[n] for n in FINISHED}
    assert _explicit_shares(seen, lambda m: m["job"] in done).size == sum(s.v.size for s in run.sent if s.job in done)


# ===================================================================================== 1. messages


def test_positive_control_the_message_search_finds_planted_contributions(run: OwnerRun, needles: NeedleSet) -> None:
    s = next(x for x in run.sent if np.any(x.v != 0))
    total = _exact_sums(run)[0]
    planted = {
        "f64": b"\x07" * 3 + s.v.astype("<f8").tobytes() + b"\x00",
        "f32 run": b"\x01" + s.v[5:9].astype("<f4").tobytes(),
        "grid": b"\x02" * 5 + np.round(s.v * 2.0**s.grid).astype("<i8").tobytes(),
        "sum at 2^16": np.round(total[2] * 2.0**16).astype("<i8").tobytes(),
    }
    missed = [k for k, blob in planted.items() if not needles.search(np.frombuffer(blob, dtype=np.uint8))]
    assert not missed, missed


def test_no_message_holds_an_owners_contribution_or_the_noise_free_sum(seen: Seen, needles: NeedleSet) -> None:
    for what, records in (("owner → compute party", seen.owner_in), ("compute party → compute party", seen.transport)):
        assert records, what
        hay, starts = _haystack(records)
        hits = needles.search(hay)
        where = [(records[int(np.searchsorted(starts, s, "right")) - 1].meta, label) for s, label, _ in hits]
        print(f"\n[owner leaks] {what}: {len(records)} messages, {hay.size} bytes searched for "
              f"{needles.count} needles: {len(hits)} hits")
        assert not hits, f"{what}: {len(hits)} hits, e.g. {where[:3]}"
    assert needles.count > 1000, needles.count


# ===================================================================================== 2. shares


def test_explicit_shares_are_uniform_and_the_test_rejects_the_plaintext(run: OwnerRun, seen: Seen) -> None:
    shares = _explicit_shares(seen)
    u = uniformity(shares)
    print(f"\n[owner leaks] explicit shares: {u}")
    assert min(u["bits_p_bonferroni"], u["bytes_chi2_p"], u["top32_ks_p"]) > 1e-4, u
    plain = np.concatenate([np.round(s.v * 2.0**s.grid).astype(np.int64) for s in run.sent])
    p = uniformity(plain)
    assert min(p["bits_p_bonferroni"], p["bytes_chi2_p"], p["top32_ks_p"]) < 1e-6, p
    feds = {run.jobs["fed"], run.jobs["fed_uniform"]}  # zero updates too: a share of 0 looks like any other
    zero_owners = {(s.job, s.owner, s.t) for s in run.sent if s.job in feds and not np.any(s.v)}
    z = _explicit_shares(seen, lambda m: (m["job"], m["owner"], m["round"]) in zero_owners)
    assert z.size > 0 and np.count_nonzero(z) == z.size  # no zero word: 2^-64 each
    uz = uniformity(z)
    assert min(uz["bits_p_bonferroni"], uz["bytes_chi2_p"]) > 1e-4, uz


# ===================================================================================== 3. files


def _files(run: OwnerRun) -> list[Path]:
    """Everything the compute daemons and their workers wrote, and what the coordinator fetched;
    not the PKI, not the owners' own directories (an owner may keep its own values)."""
    out = []
    for base in (run.cons_root, run.root / "results"):
        out += [p for p in sorted(base.rglob("*")) if p.is_file() and "pki" not in p.relative_to(base).parts]
    return out


def _secret_floats(run: OwnerRun) -> np.ndarray:
    vals = np.concatenate([*(s.v for s in run.sent), *(t for _, _, t, _ in _exact_sums(run))])
    return np.sort(np.abs(vals[vals != 0]))


def _scan(blob: bytes, needles: NeedleSet, secrets: np.ndarray, keys: list[bytes]) -> list[str]:
    found = [f"{label} at byte {s}" for s, label, _ in needles.search(np.frombuffer(blob, dtype=np.uint8))]
    found += ["share key" for k in keys if k in blob or k.hex().encode() in blob]
    found += [f"value {x}" for x, digits in _numbers(blob) if digits >= 10 and _is_secret(x, secrets)]
    return found


def test_positive_control_the_file_scan_finds_planted_values(run: OwnerRun, needles: NeedleSet) -> None:
    s = next(x for x in run.sent if np.any(np.abs(x.v) > 1e-3))
    i = int(np.argmax(np.abs(s.v)))
    secrets = _secret_floats(run)
    planted = {
        "log line": f"owner {s.owner} sent {float(s.v[i])!r}".encode(),
        "json": json.dumps({"sum": float(_exact_sums(run)[1][2][3])}).encode(),
        "key": b"key=" + run.keys[0].hex().encode(),
        "binary": b"\x00" * 3 + s.v.astype("<f8").tobytes(),
    }
    missed = [k for k, blob in planted.items() if not _scan(blob, needles, secrets, run.keys)]
    assert not missed, missed


def test_compute_parties_files_hold_no_contribution_sum_or_key(run: OwnerRun, needles: NeedleSet) -> None:
    files = _files(run)
    names = {p.name for p in files}
    assert {"daemon.log", "jobs.sqlite3", "privacy_report.json", "metrics.json"} <= names, names
    secrets = _secret_floats(run)
    findings = [f"{p.relative_to(run.root)}: {f}" for p in files
                for f in _scan(p.read_bytes(), needles, secrets, run.keys)]
    print(f"\n[owner leaks] {len(files)} files, {sum(p.stat().st_size for p in files)} bytes, "
          f"{len(run.keys)} share keys: {len(findings)} findings")
    assert not findings, f"{len(findings)} findings, e.g. {findings[:5]}"


# ===================================================================================== 4. the abort


def test_after_a_compute_party_dies_nothing_more_is_released(run: OwnerRun, seen: Seen) -> None:
    job = run.jobs["killed"]
    assert run.ends["killed"] == {"alice": "failed", "carol": "failed"}, run.ends["killed"]
    assert all(isinstance(v, Exception) for v in run.outcomes["killed"].values()), run.outcomes["killed"]
    published = {(x.meta["member"], x.meta["t"]) for x in seen.plain
                 if x.meta["kind"] == "owner_release" and x.meta["job"] == job}
    assert {t for _, t in published} == set(range(KILL_AFTER)), sorted(published)
    for p in ("alice", "carol"):
        assert not (run.cons_root / p / "state" / "jobs" / job / "model.safetensors").exists()

