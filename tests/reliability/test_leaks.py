"""What leaks: every message of real jobs, the distribution of the shares, and what lands on disk.

One consortium (3 party daemons + a dealer daemon, UCI Adult, real processes, gRPC + mutual TLS on
loopback) runs with the test-only recorder of ``tests/reliability/recording.py`` (installed in the
daemons and their job workers through a ``sitecustomize`` hook: no product file knows about it):

* an output-perturbation job and a 3-round gradient-perturbation job (both succeed),
* a gradient job cancelled by the coordinator mid-run (while the parties sample noise in the MPC),
* a job refused by policy (ε above the parties' ``max_epsilon_per_job``);
* failure paths (issue 13, item 7; ``failing_data``): carol's data file with an out-of-range
  regression label, one with a text label in a binary data set, a schema mismatch (carol has a
  column the others do not), and a gradient job whose worker at carol is SIGKILLed mid-run.

Then, sharing that one run (module fixture):

1. every message is recorded on both sides, byte-identical; the dealer receives only JSON tuple
   requests (sizes and op names) from party 0; and no sent payload or header contains, at any byte
   offset, a party's local model, gradient sum, weighted contribution, the noise, the exact
   (noise-free) aggregate, or a data row — as float64, float32, or int64 fixed point at CrypTen's
   2^16 scale or at the job's noise grid 2^g. The revealed noisy aggregate is public by design: it is
   searched for separately and would only be excluded, never counted as a leak (it does not occur:
   small all_reduces exchange shares, each party sums locally);
2. every party's outgoing int64 shares (the aggregate's input shares, the Beaver openings — arithmetic,
   squares, binary ANDs, the comparison chain's, B2A —, any other sampler opening) and the dealer's
   corrections are
   indistinguishable from uniform ring elements by 64 per-bit binomial tests (Bonferroni), a byte
   chi-square and a KS test of the top 32 bits — while the same tests reject the plaintext
   encodings (power);
3. no daemon log, worker log, job store, ledger, audit log, job directory file (other than the
   model and the plot, the intended release), privacy report, metrics or coordinator output holds a
   PEM key marker, a key body, a pairwise mask key, a 16+ digit integer equal to a captured share,
   three consecutive feature values of a row, a noise value, the exact aggregate or a party's local
   value (as text with 10+ significant digits, or as binary encodings).

Positive controls show each search can fail: planted needles at unaligned offsets, planted log
lines of each kind, and the uniformity tests' rejection of plaintext encodings.

A packet capture on loopback (tcpdump/tshark) would be useless here: every channel is TLS 1.3, so
the wire shows only ciphertext. The recorder therefore sits at the plaintext side of the transport,
right where payloads are handed to gRPC and where the mailbox stores them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import re
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from coordinator.consortium import LocalConsortium
from coordinator.end_to_end import LocalJob, job_toml
from mpc_erm.jobs.status import TERMINAL
from parties.public_errors import code_of

from .failing_data import (
    FAILING_JOBS,
    OWN_COLUMN,
    VICTIM,
    VICTIM_COLUMN,
    VICTIM_SECRETS,
    add_datasets,
    crossings,
    reason_problems,
)
from .failing_data import job_toml as failing_job_toml
from .faults import wait_for, worker_pids
from .recording import NeedleSet, Record, read_records, runs, start_recorded, uniformity, value_bytes

pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.long]  # `make test-long` (CI runs it)

PARTIES = ("alice", "bob", "carol")
ALPHA = 1e-4  # family-wise false-alarm rate of the uniformity tests in one run (Bonferroni)
CRYPTEN_BITS = 16
RESULT_FILES_RELEASED = {"model.safetensors", "training_curve.png"}  # the release itself: not scanned


# ===================================================================================== the run


@dataclass
class Run:
    root: Path
    cons_root: Path
    rec: Path
    jobs: dict[str, str] = field(default_factory=dict)  # name -> job id
    ends: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> member -> phase
    refusal: str = ""
    coordinator_out: Path | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    statuses: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # name -> member -> GetStatus


def _write_job(root: Path, job: LocalJob) -> Path:
    path = root / "jobs" / f"{job.name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(job_toml(job, list(PARTIES), "adult", "dealer", "dealer"))
    return path


def _watch(client: Any, job_id: str, out: list[dict[str, Any]], cancel_on: str | None = None,
           timeout_s: float = 400.0, kill_on: tuple[str, Any] | None = None) -> dict[str, str]:
    """Follow a job to its end at every member; cancel it when ``cancel_on`` is first seen (or call
    ``kill_on[1]()`` when the phase ``kill_on[0]`` is)."""
    ends: dict[str, str] = {}
    cancelled = killed = False
    t0 = time.monotonic()
    for ev in client.watch(job_id):
        out.append(ev)
        if cancel_on is not None and not cancelled and ev["phase"] == cancel_on:
            out.append({"cancel": client.cancel(job_id, reason="leak test: cancelled mid-run")})
            cancelled = True
        if kill_on is not None and not killed and ev["phase"] == kill_on[0]:
            out.append({"killed": kill_on[1]()})
            killed = True
        if ev["phase"] in TERMINAL or ev["phase"] == "error":
            ends[ev["member"]] = ev["phase"]
        assert time.monotonic() - t0 < timeout_s, f"job {job_id} did not end: {ends}"
    return ends


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("leaks")
    site, rec = root / "site", root / "rec"
    r = Run(root=root, cons_root=root / "consortium", rec=rec)
    cons = LocalConsortium(r.cons_root, parties=3, dataset="adult", budget_epsilon=10.0)
    cons.write()
    add_datasets({p: cons.members[p].config for p in PARTIES}, data_root=root / "data")  # outside the scanned dirs
    t0 = time.perf_counter()
    start_recorded(cons, site, rec)  # only the daemons (and their workers) record
    coord: list[dict[str, Any]] = []
    try:
        with cons.client() as client:
            specs = [
                ("output", LocalJob("leak-output", "output", lam=1e-3), None),
                ("gradient", LocalJob("leak-gradient", "gradient", lam=1e-4, iterations=3, learning_rate=20.0), None),
                ("cancelled", LocalJob("leak-cancel", "gradient", lam=1e-4, iterations=3, learning_rate=20.0),
                 "offline"),
            ]
            for name, job, cancel_on in specs:
                tic = time.perf_counter()
                sub = client.submit(_write_job(root, job))
                coord.append({"submit": sub})
                r.jobs[name] = sub["job_id"]
                r.ends[name] = _watch(client, sub["job_id"], coord, cancel_on)
                coord.append({"status": client.status(sub["job_id"])})
                if name != "cancelled":
                    coord.append({"result": client.result(sub["job_id"], root / "results" / name)})
                r.seconds[name] = time.perf_counter() - tic
            from coordinator.client import SubmitRefused

            with pytest.raises(SubmitRefused) as refused:
                client.submit(_write_job(root, LocalJob("leak-refused", "output", lam=1e-3, epsilon=2.0)))
            r.refusal = str(refused.value)
            coord.append({"refused": r.refusal, "refusals": refused.value.refusals})
            for fj in FAILING_JOBS:  # failure paths: carol's bad files, a schema mismatch
                tic = time.perf_counter()
                path = root / "jobs" / f"{fj.name}.toml"
                path.write_text(failing_job_toml(fj, list(PARTIES), "dealer"))
                sub = client.submit(path)
                coord.append({"submit": sub})
                r.jobs[fj.name] = sub["job_id"]
                r.ends[fj.name] = _watch(client, sub["job_id"], coord)
                r.statuses[fj.name] = client.status(sub["job_id"])
                coord.append({"status": r.statuses[fj.name]})
                r.seconds[fj.name] = time.perf_counter() - tic
            tic = time.perf_counter()  # ... and a peer lost mid-run: carol's worker SIGKILLed
            sub = client.submit(_write_job(root, LocalJob("leak-killed", "gradient", lam=1e-4, iterations=3,
                                                          learning_rate=20.0)))
            coord.append({"submit": sub})
            r.jobs["killed"] = sub["job_id"]
            r.ends["killed"] = _watch(client, sub["job_id"], coord,
                                      kill_on=("offline", lambda: _kill_worker(r, VICTIM, sub["job_id"])))
            r.statuses["killed"] = client.status(sub["job_id"])
            coord.append({"status": r.statuses["killed"]})
            r.seconds["killed"] = time.perf_counter() - tic
            coord.append({"list": client.list()})
    finally:
        cons.stop()
        r.coordinator_out = root / "coordinator_output.json"
        r.coordinator_out.write_text(json.dumps(coord, indent=1, default=str))
    r.seconds["total"] = time.perf_counter() - t0
    return r


def _kill_worker(r: Run, member: str, job_id: str) -> int:
    pids = wait_for(lambda: worker_pids(r.cons_root / member / "state", job_id), 60.0, f"{member}'s worker")
    os.kill(pids[-1], signal.SIGKILL)
    return int(pids[-1])


# ===================================================================================== captured


@dataclass
class Captured:
    sent: list[Record]
    recv: dict[tuple[str, int, int, int], tuple[bytes, str]]  # key -> (header, payload sha256)
    plain: list[Record]
    ranks: dict[str, int]
    recorded_bytes: int  # everything the recorder wrote (sent, received, plaintext dumps)

    def plain_of(self, kind: str, job: str) -> list[Record]:
        return [p for p in self.plain if p.meta["kind"] == kind and p.meta["job"] == job]


def _key(m: dict[str, Any]) -> tuple[str, int, int, int]:
    return (m["job"], m["src"], m["dst"], m["seq"])


@pytest.fixture(scope="module")
def captured(run: Run) -> Captured:
    sent, plain, recv = [], [], {}
    for r in read_records(run.rec):
        if r.dir == "sent":
            sent.append(r)
        elif r.dir == "recv":
            recv[_key(r.meta)] = (r.header, hashlib.sha256(r.payload).hexdigest())
        else:
            plain.append(r)
    ranks = {}
    for r in sent:
        ranks[r.meta["member"]] = r.meta["src"]
    size = sum(p.stat().st_size for p in run.rec.glob("rec-*.bin"))
    return Captured(sent, recv, plain, ranks, size)


@dataclass
class Plaintext:
    """What the parties knew in the clear, as the workers dumped it, per job and aggregate."""

    private: NeedleSet
    public: NeedleSet
    noise: list[np.ndarray]  # per aggregate: int64 grid units
    noise_real: np.ndarray  # every noise value in real units
    exact_real: np.ndarray  # every exact (noise-free) aggregate coordinate in real units
    party_real: np.ndarray  # every value of the parties' local models, gradient sums, contributions
    rows: np.ndarray  # Adult training rows (all parties')
    counts: dict[str, int]


def _encodings(x: np.ndarray, g: int) -> dict[str, np.ndarray]:
    """Per-value byte encodings of a float vector: float64, float32, int64 at 2^16 and 2^g."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    return {
        "f64": value_bytes(x, "<f8"),
        "f32": value_bytes(x, "<f4"),
        f"fix{CRYPTEN_BITS}": value_bytes(np.round(x * 2.0**CRYPTEN_BITS).astype(np.int64), "<i8"),
        f"fix{g}": value_bytes(np.round(x * 2.0**g).astype(np.int64), "<i8"),
    }


def _add_vector(ns: NeedleSet, what: str, x: np.ndarray, g: int) -> None:
    """Each value alone (8-byte encodings) and runs of 2 and 3 (all encodings, incl. float32)."""
    for enc, per in _encodings(x, g).items():
        label = f"{what}/{enc}"
        if per.shape[1] == 8:
            ns.add(label, per)
        for k in (2, 3):
            ns.add(label, runs(per, k))


def _add_ring(ns: NeedleSet, what: str, z: np.ndarray, g: int) -> None:
    """An int64 vector in grid units: itself, at CrypTen's scale, and in real units."""
    z = np.asarray(z, dtype=np.int64)
    per = value_bytes(z, "<i8")
    ns.add(f"{what}/grid{g}", per)
    for k in (2, 3):
        ns.add(f"{what}/grid{g}", runs(per, k))
    crypten_scale = np.round(z.astype(np.float64) * 2.0 ** (CRYPTEN_BITS - g)).astype(np.int64)
    per16 = value_bytes(crypten_scale, "<i8")
    ns.add(f"{what}/fix{CRYPTEN_BITS}", per16)
    for k in (2, 3):
        ns.add(f"{what}/fix{CRYPTEN_BITS}", runs(per16, k))
    real = z.astype(np.float64) / 2.0**g
    for enc in ("<f8", "<f4"):
        pv = value_bytes(real, enc)
        if pv.shape[1] == 8:
            ns.add(f"{what}/real{enc[-2:]}", pv)
        for k in (2, 3):
            ns.add(f"{what}/real{enc[-2:]}", runs(pv, k))


def _adult_rows() -> np.ndarray:
    from mpc_erm.data import load_dataset

    train, _ = load_dataset("adult")
    return np.asarray(train.X, dtype=np.float64)


def _row_windows(rows: np.ndarray) -> np.ndarray:
    """(N, 3) windows (x[k-1], x[k], x[k+1]) of every row around every non-zero x[k]."""
    padded = np.pad(rows, ((0, 0), (1, 1)))
    r, c = np.nonzero(rows)
    return np.stack([padded[r, c], padded[r, c + 1], padded[r, c + 2]], axis=1)


@pytest.fixture(scope="module")
def plaintext(run: Run, captured: Captured) -> Plaintext:
    private, public = NeedleSet(), NeedleSet()
    noises, noise_real, exact_real, party_real = [], [], [], []
    for name in ("output", "gradient"):
        job = run.jobs[name]
        by_t: dict[int, dict[str, dict[str, np.ndarray]]] = defaultdict(dict)
        g_of: dict[int, int] = {}
        for kind in ("contributions", "local", "result"):
            for p in captured.plain_of(kind, job):
                by_t[p.meta["t"]].setdefault(kind, {})[p.meta["member"]] = p.float64()
                g_of[p.meta["t"]] = p.meta["g"]
        shares: dict[int, dict[str, np.ndarray]] = defaultdict(dict)
        t_of_noise: dict[str, int] = Counter()
        for p in captured.plain_of("noise_share", job):  # in aggregate order, one per aggregate
            shares[t_of_noise[p.meta["member"]]][p.meta["member"]] = p.int64()
            t_of_noise[p.meta["member"]] += 1
        for t, d in sorted(by_t.items()):
            g = g_of[t]
            assert set(d["local"]) == set(PARTIES) and set(shares[t]) == set(PARTIES), (name, t)
            z = np.sum(np.stack([shares[t][m] for m in PARTIES]), axis=0, dtype=np.int64)  # wraps mod 2^64
            enc = {m: np.round(d["local"][m] * 2.0**g).astype(np.int64) for m in PARTIES}
            exact = np.sum(np.stack(list(enc.values())), axis=0, dtype=np.int64)
            revealed = np.round(d["result"]["alice"] * 2.0**g).astype(np.int64)
            # the dumps are what the MPC used: revealed ring value = Σ enc(v_i) + z, exactly
            assert np.array_equal(revealed, exact + z), (name, t)
            assert all(np.array_equal(d["result"][m], d["result"]["alice"]) for m in PARTIES)
            noises.append(z)
            noise_real.append(z / 2.0**g)
            exact_real.append(exact / 2.0**g)
            for m in PARTIES:
                party_real += [d["contributions"][m], d["local"][m]]
                _add_vector(private, f"contribution[{m}]", d["contributions"][m], g)
                _add_vector(private, f"weighted[{m}]", d["local"][m], g)
            for a, b in ((0, 1), (0, 2), (1, 2)):  # two parties' inputs summed: more than the release
                _add_ring(private, "partial-sum", enc[PARTIES[a]] + enc[PARTIES[b]], g)
            _add_ring(private, "noise", z, g)
            _add_ring(private, "exact-aggregate", exact, g)
            _add_vector(public, "revealed", d["result"]["alice"], g)
            _add_ring(public, "revealed", revealed, g)
        for p in captured.plain_of("local_model", job):
            party_real.append(p.float64())
            _add_vector(private, f"local-model[{p.meta['member']}]", p.float64(), max(g_of.values()))
    rows = _adult_rows()
    win = _row_windows(rows)
    private.add("data-row/f64", value_bytes(win, "<f8").reshape(len(win), 24), anchor=8)
    private.add("data-value/f64", value_bytes(np.unique(win[:, 1]), "<f8"))  # alone: e.g. inside an object
    private.add("data-row/f32", value_bytes(win, "<f4").reshape(len(win), 12), anchor=4)
    fix = np.round(win * 2.0**CRYPTEN_BITS).astype(np.int64)
    private.add(f"data-row/fix{CRYPTEN_BITS}", value_bytes(fix, "<i8").reshape(len(win), 24), anchor=8)
    counts = Counter()
    for label, data, _ in private.groups:
        counts[label.split("[")[0].split("/")[0]] += len(data)
    return Plaintext(private, public, noises, np.concatenate(noise_real), np.concatenate(exact_real),
                     np.concatenate(party_real), rows, dict(counts))


def _haystack(records: list[Record]) -> tuple[np.ndarray, np.ndarray]:
    """Every payload and header, concatenated; starts[i] is where record i begins."""
    parts, starts, off = [], [], 0
    for r in records:
        starts.append(off)
        parts.append(r.header)
        parts.append(r.payload)
        off += len(r.header) + len(r.payload)
    return np.frombuffer(b"".join(parts), dtype=np.uint8), np.array(starts, dtype=np.int64)


def _report(run: Run, key: str, value: Any) -> None:
    """The figures the issue asks for: printed (pytest -s) and kept in the run's figures.json."""
    path = run.root / "figures.json"
    figures = json.loads(path.read_text()) if path.exists() else {}
    figures[key] = value
    path.write_text(json.dumps(figures, indent=1, default=str))
    print(f"\n[leaks] {key}: {json.dumps(value, default=str)}")


# ===================================================================================== 1. messages


def test_the_jobs_ran_as_planned(run: Run) -> None:
    assert run.ends["output"] == dict.fromkeys([*PARTIES, "dealer"], "succeeded"), run.ends
    assert run.ends["gradient"] == dict.fromkeys([*PARTIES, "dealer"], "succeeded"), run.ends
    assert "cancelled" in run.ends["cancelled"].values(), run.ends["cancelled"]
    assert "max_epsilon_per_job" in run.refusal, run.refusal
    _report(run, "seconds", {k: round(v, 1) for k, v in run.seconds.items()})


def test_every_message_is_recorded_on_both_sides_and_the_dealer_gets_only_requests(
        run: Run, captured: Captured) -> None:
    from mpc_erm.mpc.transport import codec

    sent_keys = {}
    for r in captured.sent:
        k = _key(r.meta)
        assert k not in sent_keys, f"message {k} recorded twice"
        sent_keys[k] = (r.header, hashlib.sha256(r.payload).hexdigest())
    done = {run.jobs["output"], run.jobs["gradient"]}
    for k, v in sent_keys.items():
        if k[0] in done:
            assert captured.recv.get(k) == v, f"message {k} differs or is missing at its receiver"
    for k, v in captured.recv.items():
        assert sent_keys.get(k) == v, f"message {k} received but not sent as such"
    dealer = captured.ranks["dealer"]
    to_dealer = [r for r in captured.sent if r.meta["dst"] == dealer]
    assert to_dealer
    for r in to_dealer:
        assert (r.meta["src"], r.meta["op"], r.meta["kind"]) == (0, "dealer/request", 2), r.meta
        text = codec.decode_object(r.payload)
        assert text == "terminate" or set(json.loads(text)) == {"function", "device", "args", "kwargs", "to"}, text
        assert text == "terminate" or json.loads(text)["to"] in range(dealer), text  # a party gets the correction
    per_job = Counter(r.meta["job"] for r in captured.sent)
    bytes_job = Counter()
    for r in captured.sent:
        bytes_job[r.meta["job"]] += len(r.payload) + len(r.header)
    names = {v: k for k, v in run.jobs.items()}
    _report(run, "messages", {
        "recorded_bytes": captured.recorded_bytes,
        **{names[j]: {"messages_sent": per_job[j], "bytes_sent": bytes_job[j],
                      "messages_received": sum(1 for k in captured.recv if k[0] == j)} for j in per_job}})


def test_positive_control_the_search_finds_planted_plaintext(plaintext: Plaintext) -> None:
    """The search must find a needle at any byte offset inside random bytes, or it proves nothing."""
    rng = np.random.default_rng(7)
    kinds = ("weighted[alice]/fix", "noise/grid", "exact-aggregate/real", "local-model[bob]/f32",
             "data-row/f32", f"data-row/fix{CRYPTEN_BITS}")
    groups = plaintext.private.groups
    for i, kind in enumerate(kinds):
        label, data, _ = next(g for g in groups if g[0].startswith(kind))
        offset = 1000 + 3 * i + 1  # never 8-aligned after the first
        hay = rng.integers(0, 256, 4096, dtype=np.uint8)
        needle = data[rng.integers(len(data))]
        hay[offset: offset + needle.size] = needle
        assert (offset, label, needle.size) in plaintext.private.search(hay), kind


def test_no_message_carries_a_partys_plaintext_the_noise_or_a_data_row(
        run: Run, captured: Captured, plaintext: Plaintext) -> None:
    hay, starts = _haystack(captured.sent)
    matches = plaintext.private.search(hay)
    public = {(s, n) for s, _, n in plaintext.public.search(hay)}
    leaks = []
    for start, label, n in matches:
        i = int(np.searchsorted(starts, start, "right")) - 1
        end = starts[i + 1] if i + 1 < len(starts) else hay.size
        if start + n > end:
            continue  # spans two records: not in any one message
        if (start, n) in public:
            continue  # the revealed aggregate, public by design
        leaks.append((label, captured.sent[i].meta))
    _report(run, "message_search", {
        "messages": len(captured.sent), "bytes_searched": int(hay.size), "needles_private": plaintext.private.count,
        "needles_public": plaintext.public.count, "needles_by_kind": plaintext.counts,
        "left_out_uninformative": sum(plaintext.private.skipped.values()), "matches": len(leaks),
        "public_matches": len(public)})
    assert not leaks, f"{len(leaks)} plaintext values found in messages, e.g. {leaks[:3]}"


# ===================================================================================== 2. uniformity


OPENINGS = {  # recorder label -> what a party's message is
    "beaver": "Beaver openings x-a, y-b",
    "beaver_square": "square openings x-r",
    "beaver_and": "binary AND openings x^a, y^b",
    "and_chain": "comparison-chain openings beta^b",
    "b2a": "B2A openings x^r",
    "wraps": "wrap-count openings x+r",
    "noise": "other sampler openings",
}


def _share_categories(captured: Captured) -> dict[str, np.ndarray]:
    """Distinct int64 tensors each member sent (an all_reduce sends one share to every peer)."""
    names = {v: k for k, v in captured.ranks.items()}
    seen, cats = set(), defaultdict(list)
    for r in captured.sent:
        m = r.meta
        if m.get("dtype") != "int64":
            continue
        h = (m["job"], m["src"], hashlib.sha256(r.payload).digest())
        if h in seen:
            continue
        seen.add(h)
        if m["op"] == "dealer/result":
            cats["dealer corrections (dealer -> a party)"].append(r.int64())
        elif m["label"] == "aggregate":
            cats["input shares of the aggregate (all parties)"].append(r.int64())
            cats[f"input shares of the aggregate ({names[m['src']]})"].append(r.int64())
        elif m["label"] in OPENINGS:
            cats[OPENINGS[m["label"]]].append(r.int64())
    return {k: np.concatenate(v) for k, v in cats.items()}


def _bounded(v: np.ndarray, n: int = 1_000_000, seed: int = 0) -> np.ndarray:
    if v.size <= n:
        return v
    return np.random.default_rng(seed).choice(v, n, replace=False)


def test_outgoing_shares_are_uniform_and_the_test_rejects_plaintext(
        run: Run, captured: Captured, plaintext: Plaintext) -> None:
    cats = _share_categories(captured)
    must = {"dealer corrections (dealer -> a party)", "input shares of the aggregate (all parties)",
            *(f"input shares of the aggregate ({m})" for m in PARTIES)}
    assert must <= set(cats) and len(set(cats) & set(OPENINGS.values())) >= 2, sorted(cats)
    plain_cats = {
        "plaintext: weighted contributions at 2^g": np.concatenate(
            [np.round(p.float64() * 2.0 ** p.meta["g"]).astype(np.int64)
             for j in (run.jobs["output"], run.jobs["gradient"]) for p in captured.plain_of("local", j)]),
        "plaintext: noise at 2^g": np.concatenate(plaintext.noise),
        f"plaintext: data rows at 2^{CRYPTEN_BITS}": _bounded(
            np.round(plaintext.rows[:2000] * 2.0**CRYPTEN_BITS).astype(np.int64).reshape(-1), 20_000),
    }
    threshold = ALPHA / (3 * (len(cats) + len(plain_cats)))  # three p-values per category
    results = {}
    for name, v in cats.items():
        res = uniformity(_bounded(v))
        results[name] = res
        worst = min(res["bits_p_bonferroni"], res["bytes_chi2_p"], res["top32_ks_p"])
        assert worst >= threshold, f"{name}: not uniform (p = {worst:.3g} < {threshold:.3g}): {res}"
    for name, v in plain_cats.items():
        res = uniformity(v)
        results[name] = res
        worst = min(res["bits_p_bonferroni"], res["bytes_chi2_p"], res["top32_ks_p"])
        assert worst < threshold, f"{name}: the tests failed to reject plaintext (p = {worst:.3g}): {res}"
    _report(run, "uniformity", {"alpha_family": ALPHA, "threshold_per_p_value": threshold, **results})


# ===================================================================================== 3. logs, files


_INT16 = re.compile(rb"-?\d{16,}")
_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _scanned_files(run: Run) -> list[Path]:
    """Everything the daemons, workers and coordinator wrote, except the PKI and the release."""
    out = []
    for base in (run.cons_root, run.root / "results"):
        for p in sorted(base.rglob("*")):
            if not p.is_file() or "pki" in p.relative_to(base).parts or p.name in RESULT_FILES_RELEASED:
                continue
            out.append(p)
    assert run.coordinator_out is not None
    return [*out, run.coordinator_out]


def _key_secrets(run: Run) -> tuple[list[bytes], list[bytes]]:
    """(text needles, raw byte strings) of every private key file of the deployment."""
    text, raw = [], []
    for key in sorted((run.cons_root / "pki").glob("*.key")):
        pem = key.read_text()
        body = "".join(line for line in pem.splitlines() if line and not line.startswith("-----"))
        text += [body[i: i + 24].encode() for i in range(0, max(1, len(body) - 24), 12)]
        raw.append(base64.b64decode(body))
    return text, raw


def _long_printed(values: np.ndarray) -> float:
    """A value whose repr has 12+ significant digits: the scan (rightly) ignores short numbers, and
    a noise value on the grid 2^-g may print short."""
    for v in map(float, values):
        if len(repr(abs(v)).split("e")[0].replace(".", "").lstrip("0")) >= 12:
            return v
    raise AssertionError("no noise value prints with 12 significant digits")


def _numbers(blob: bytes) -> list[tuple[float, int]]:
    """Every number written in a text, with its count of significant digits."""
    out = []
    for m in _NUMBER.finditer(blob):
        s = m.group().decode()
        mant = re.split(r"[eE]", s)[0].lstrip("-").replace(".", "").lstrip("0")
        try:
            x = float(s)
        except ValueError:
            continue
        if math.isfinite(x):  # "…4919948e512" inside a hex job id reads as inf, which "matched" the largest secret
            out.append((x, len(mant)))
    return out


def _is_secret(x: float, secrets: np.ndarray) -> bool:
    """Is ``x`` (a number printed with 10+ significant digits) one of ``secrets`` (sorted |values|)
    to 1e-9 relative?"""
    j = np.searchsorted(secrets, abs(x))
    return any(0 <= k < secrets.size and abs(secrets[k] - abs(x)) <= 1e-9 * abs(x) for k in (j - 1, j))


def _unit(printed: float, digits: int) -> float:
    """One unit in the last printed place of a number written with ``digits`` significant digits."""
    return float(10.0 ** (np.floor(np.log10(abs(printed))) - max(digits, 1) + 1)) if printed else 0.0


def _printed_as(printed: float, digits: int, true: np.ndarray) -> np.ndarray:
    """Could each of ``true`` have been printed as ``printed`` with ``digits`` significant digits?"""
    if printed == 0:
        return true == 0
    return (true != 0) & (np.abs(true - printed) <= _unit(printed, digits))


class Scanner:
    """Looks for the run's secrets in a file's bytes, as text and as binary."""

    def __init__(self, run: Run, captured: Captured, plaintext: Plaintext) -> None:
        key_text, key_raw = _key_secrets(run)
        self.pair_keys = [p.payload for p in captured.plain if p.meta["kind"] == "pair_key"]
        self.secrets_text = key_text + [k.hex().encode() for k in self.pair_keys] + [
            base64.b64encode(k) for k in self.pair_keys]
        self.binary = NeedleSet()
        for raw in [*key_raw, *self.pair_keys]:
            self.binary.add("key-bytes", runs(value_bytes(np.frombuffer(raw, np.uint8), "u1"), 16))
        self.private = plaintext.private
        self.shares = np.sort(np.concatenate([r.int64() for r in captured.sent if r.meta.get("dtype") == "int64"]))
        windows = _row_windows(plaintext.rows)
        order = np.argsort(windows[:, 1], kind="stable")
        self.mids, self.windows = windows[order, 1], windows[order]
        secret = np.sort(np.abs(np.concatenate([plaintext.noise_real, plaintext.exact_real, plaintext.party_real])))
        # A value of a few grid units (e.g. noise of exactly 1 unit: 2^-16) has a ≤ 4-bit mantissa
        # and is a public constant too (metrics.json prints the resolution 2^-16): not evidence.
        mant = np.frexp(secret)[0] * 2.0**53
        low_info = np.array([int(m) & -int(m) for m in mant], dtype=float) >= 2.0**49 if mant.size else mant > 0
        self.secret_floats = secret[(secret > 0) & ~low_info]
        self.ints16 = self.long_numbers = self.bytes = 0

    def scan(self, where: str, blob: bytes) -> list[str]:
        findings: list[str] = []
        self.bytes += len(blob)
        if b"-----BEGIN" in blob or b"PRIVATE KEY" in blob:
            findings.append(f"{where}: PEM marker")
        findings += [f"{where}: key material" for s in self.secrets_text if s in blob]
        hay = np.frombuffer(blob, dtype=np.uint8)
        findings += [f"{where}: {label} at byte {s}" for s, label, _ in self.private.search(hay)]
        findings += [f"{where}: {label} at byte {s}" for s, label, _ in self.binary.search(hay)]
        for m in _INT16.finditer(blob):  # a share (or seed) written as a decimal integer
            self.ints16 += 1
            v = int(m.group())
            v = v - (1 << 64) if v >= 1 << 63 else v
            if -(1 << 63) <= v < 1 << 63:
                i = np.searchsorted(self.shares, v)
                if i < self.shares.size and self.shares[i] == v:
                    findings.append(f"{where}: share value {v}")
        nums = _numbers(blob)
        for i, (x, digits) in enumerate(nums):
            if digits >= 10:  # noise, exact aggregate or a party's local value printed to ~full precision
                self.long_numbers += 1
                if _is_secret(x, self.secret_floats):
                    findings.append(f"{where}: noise / exact aggregate / local value {x}")
            if 0 < i < len(nums) - 1 and digits >= 4 and x != 0:  # 3 consecutive values of a row
                unit = _unit(x, digits)
                lo, hi = np.searchsorted(self.mids, x - unit, "left"), np.searchsorted(self.mids, x + unit, "right")
                cand = self.windows[lo:hi]
                (a, da), (b, db) = nums[i - 1], nums[i + 1]
                if cand.size and np.any(_printed_as(a, da, cand[:, 0]) & _printed_as(b, db, cand[:, 2])):
                    findings.append(f"{where}: data row values {[a, x, b]}")
        return findings


@pytest.fixture(scope="module")
def scanner(run: Run, captured: Captured, plaintext: Plaintext) -> Scanner:
    return Scanner(run, captured, plaintext)


def test_positive_control_the_file_scan_finds_planted_secrets(
        run: Run, scanner: Scanner, plaintext: Plaintext) -> None:
    """Each kind of secret, written the way a careless log line or report would, must be found."""
    rng = np.random.default_rng(11)
    w = _row_windows(plaintext.rows[5:6])[2]
    weighted = next(d for lab, d, _ in plaintext.private.groups if lab.startswith("weighted[carol]/f64"))
    key_pem = next((run.cons_root / "pki").glob("*.key")).read_bytes()
    planted = {
        "pem": b"error: " + key_pem,
        "key body": b"cert " + key_pem.splitlines()[2][:40],
        "pair key": b"mask key " + scanner.pair_keys[0].hex().encode(),
        "share": f"share {int(rng.choice(scanner.shares))}".encode(),
        "noise": json.dumps({"noise": _long_printed(plaintext.noise_real)}).encode(),
        "exact aggregate": f"sum={plaintext.exact_real[3]!r}".encode(),
        "row (repr)": f"row: {w.tolist()}".encode(),
        "row (%.6g)": ("row " + " ".join(f"{v:.6g}" for v in w)).encode(),
        "model bytes": b"\x00" * 5 + weighted[0].tobytes() + b"\x01" * 3,
        "local value": f"theta_j[3] = {float(plaintext.party_real[3])!r}".encode(),
    }
    missed = [k for k, blob in planted.items() if not scanner.scan(k, blob)]
    assert not missed, f"the scan missed planted {missed}"


def test_logs_reports_and_job_files_hold_no_share_key_noise_or_row(run: Run, scanner: Scanner) -> None:
    files = _scanned_files(run)
    names = {p.name for p in files}
    assert {"daemon.log", "audit.jsonl", "privacy_report.json", "metrics.json", "jobs.sqlite3"} <= names, names
    logs = "\n".join(p.read_text(errors="replace") for p in files if p.name == "daemon.log")
    assert "cancel" in logs and "max_epsilon_per_job" in logs, "the failing jobs left no trace to scan"
    scanner.ints16 = scanner.long_numbers = scanner.bytes = 0
    findings = [f for p in files for f in scanner.scan(str(p.relative_to(run.root)), p.read_bytes())]
    _report(run, "files_scanned", {
        "files": len(files), "bytes": scanner.bytes, "integers_16_digits": scanner.ints16,
        "numbers_with_10_digits": scanner.long_numbers, "share_values_known": int(scanner.shares.size),
        "findings": len(findings),
        "by_file": {str(p.relative_to(run.root)): p.stat().st_size for p in files}})
    assert not findings, f"{len(findings)} secrets on disk, e.g. {findings[:5]}"


# ===================================================================================== 4. failures


def test_failures_leave_a_party_only_as_a_code_and_a_public_reason(run: Run, captured: Captured) -> None:
    """Issue 13, item 7: what the coordinator and the other members learn of a failure. Carol's file
    path, her label value or text label and her column name are in no other member's files (logs,
    job tables, ledgers), in nothing the coordinator received, and in no share-transport message
    (nor is any party's column name: the schema agreement compares salted digests)."""
    members = [*PARTIES, "dealer"]
    for fj in FAILING_JOBS:
        assert run.ends[fj.name] == dict.fromkeys(members, "failed"), (fj.name, run.ends[fj.name])
        assert not reason_problems(fj, run.statuses[fj.name]), reason_problems(fj, run.statuses[fj.name])
    killed = run.statuses["killed"]
    assert killed[VICTIM]["status"] == "failed" and "worker process exited" in killed[VICTIM]["reason"], killed
    for m in members:
        if m == VICTIM:
            continue
        reason = killed[m]["reason"] or ""
        assert killed[m]["status"] in ("failed", "cancelled") and code_of(reason) in ("PEER_LOST", "PEER_FAILED"), (
            m, killed[m])
        assert any(f"'{o}'" in reason for o in members if o != m), (m, reason)  # names the peer it lost
    found = crossings(run.cons_root, members, coordinator_output=[run.coordinator_out.read_bytes()])
    needles = [n.encode() for n in (*VICTIM_SECRETS, OWN_COLUMN, VICTIM_COLUMN)]
    found += [f"message {r.meta}: {n!r}" for r in captured.sent for n in needles if n in r.payload or n in r.header]
    _report(run, "failure_paths", {
        "jobs": {n: {m: st["reason"] for m, st in run.statuses[n].items()} for n in run.statuses},
        "findings": len(found)})
    assert not found, found[:10]
