"""What a compute party that deviates in one message achieves against the semi-honest modes: a
seeded campaign of single-message deviations, the control for a malicious-secure mode.

    python -m benchmarks.deviation_campaign --trials 60 --out benchmarks/results/deviation_campaign_semi_honest.json
    python -m benchmarks.deviation_campaign --trials 210 --kinds flip,zero,drop --noise mpc \
        --out benchmarks/results/deviation_campaign_semi_honest_kinds.json
    python -m benchmarks.deviation_campaign --trials 210 --kinds flip,zero,drop --noise distributed \
        --out benchmarks/results/deviation_campaign_semi_honest_distributed.json
    python -m benchmarks.deviation_campaign --security malicious --trials 250 --kinds flip,zero,drop,consistent,input \
        --out benchmarks/results/deviation_campaign_malicious.json

Each trial is one session of three compute processes (gRPC + mTLS, 3-party replicated sharing):
one noisy aggregate of known contributions (d coordinates, σ on the grid; the noise sampled inside
the MPC, or each party's own share with ``--noise distributed``), exactly as a job's round. Party 1
deviates in its k-th outgoing tensor message after the session's set-up (k uniform over the
messages an honest run sends, counted in a first run), by a kind drawn from ``--kinds``: ``flip``
one bit (position from the trial's seed), ``zero`` the whole message, or ``drop`` it (never sent,
its key used up, as if lost) — each reaches one party only — or, ``consistent``, it alters one bit
of its share in its k-th all_reduce for every recipient alike (k uniform over its all_reduce
calls): the deviation no agreement can see, which only a malicious-secure protocol catches.

With ``--security malicious`` the aggregate is the malicious-secure one
(:mod:`mpc_erm.mpc.verified_aggregator`, distributed noise); it opens by all-gathers, so
``consistent`` alters party 1's k-th all_gather for every recipient alike, and one more kind,
``input``, has party 1 substitute a contribution 20 times its bound with a proof forged by the
honest recipe applied to it (every value reduced into range). In that mode each party reports its
own outcome, and a trial is judged by the two honest parties: both stopped (caught), one stopped
(selective), or both released (the releases compared as below). Outcomes:

* ``caught_integrity`` — the parties' agreement checks stopped the job (IntegrityError: differing
  reveals, a stalled sampler);
* ``caught_other`` — it ended with another error (a desynchronised program, a timeout, the range
  check);
* ``caught_selective`` — (malicious mode, which reports each party's own outcome) one honest party
  stopped and the other released: security with *selective* abort;
* ``silent_corrupted`` — it finished, every party with the same release, off the true sum by more
  than 8 σ somewhere: a release nobody can tell from a correct one;
* ``silent_plausible`` — it finished with a release within 8 σ of the true sum: harmless, or the
  noise shrunk (which cannot be seen from outside).

Only a malicious-secure protocol moves the silent outcomes to caught.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.aggregate import jsonable, machine_info

DIM, SIGMA, FAR = 16, 4.0, 8.0
DEVIATOR = 1
DEADLINE_S = 5.0  # every wait's bound: a dropped message ends the trial after this long


def _contributions(rank: int) -> Any:
    import torch

    return torch.linspace(-1.0, 1.0, DIM, dtype=torch.float64) * (rank + 1)


BOUND = 10.0  # each party's public ℓ2 bound in the malicious mode (the contributions' norms are 2.4–7.1)


def _own_outcome(outcomes: str, rank: int, outcome: dict[str, Any], tic: float) -> None:
    """The malicious mode: write this party's own outcome, then wait (at most three deadlines, the
    longest an honest party may wait) until every party wrote its own, so that the first party to
    stop does not end the others' processes before they decided."""
    folder = Path(outcomes)
    (folder / f"{rank}.json").write_text(json.dumps(outcome))
    while time.monotonic() < tic + 3 * DEADLINE_S + 1.0 and len(list(folder.glob("*.json"))) < 3:
        time.sleep(0.05)


def _party(ctx: Any, flip: tuple[int, int, str] | None, noise: str, security: str = "semi-honest",
           outcomes: str = "") -> dict[str, Any]:
    import math
    from concurrent.futures import Future

    import torch

    from mpc_erm.mpc.aggregator import MpcAggregator
    from mpc_erm.mpc.local_noise import DistributedNoise
    from mpc_erm.mpc.noise import InMpcNoise, plan_noise
    from mpc_erm.protocols.aggregation import NoiseSpec

    sent: list[str] = []
    ep = ctx.comm.endpoint
    post = ep.post

    def counting(dst: int, op: str, payload: Any, **kw: Any) -> Any:
        if isinstance(payload, torch.Tensor):
            if flip is not None and flip[2] in ("flip", "zero", "drop") and len(sent) == flip[0]:
                sent.append(op)
                if flip[2] == "drop":  # never sent; its key used up, so the receiver waits in vain
                    ep._take_seq(ep._send_seq, dst)
                    done: Future[None] = Future()
                    done.set_result(None)
                    return done
                payload = payload.clone()
                flat = payload.reshape(-1).view(torch.uint8)
                if flip[2] == "zero":
                    flat.zero_()
                elif flat.numel():
                    byte = flip[1] % flat.numel()
                    flat[byte] ^= 1 << (flip[1] % 8)
                return post(dst, op, payload, **kw)
            sent.append(op)
        return post(dst, op, payload, **kw)

    reduces = [0]
    opening = "all_gather" if security == "malicious" else "all_reduce"
    reduce = getattr(ctx.comm, opening)

    def consistent(value: Any, *args: Any, **kw: Any) -> Any:
        """The same altered share to every party: bit ``flip[1] mod 63`` of one word of its input."""
        hit = flip is not None and flip[2] == "consistent" and reduces[0] == flip[0] and isinstance(value, torch.Tensor)
        if hit and security == "malicious" and value.numel():  # hashes and coins are bytes: any word, any bit
            value = value.clone()
            flat = value.reshape(-1).view(torch.uint8)
            flat[flip[1] % flat.numel()] ^= 1 << (flip[1] % 8)
        elif hit and value.dtype == torch.long and value.numel():
            value = value.clone()
            value.view(-1)[flip[1] % value.numel()] ^= 1 << (flip[1] % 63)
        reduces[0] += 1
        return reduce(value, *args, **kw)

    if ctx.rank == DEVIATOR:
        ep.post = counting
        setattr(ctx.comm, opening, consistent)
    c = _contributions(ctx.rank)
    if security == "malicious":  # distributed noise, the verified aggregate
        import mpc_erm.mpc.verified_aggregator as V

        grid = plan_noise(NoiseSpec("gaussian", SIGMA, sensitivity=1.0), DIM, 3).grid_bits
        spec = NoiseSpec("gaussian", SIGMA / math.sqrt(2.0), sensitivity=1.0, grid_bits=grid)
        pool = DistributedNoise()
        if ctx.rank == DEVIATOR and flip is not None and flip[2] == "input":
            from tests.mpc.forgery import forge

            V.N.prove_norm = forge
            c = c * (20.0 * BOUND / float(c.norm()))
        magg = V.VerifiedAggregator(pool, (BOUND,) * 3, ctx.comm)
        tic = time.monotonic()
        try:
            out = magg.aggregate(c[None], torch.ones(1, dtype=torch.float64), spec)
            _own_outcome(outcomes, ctx.rank, {"release": out.tolist()}, tic)
        except Exception as exc:
            _own_outcome(outcomes, ctx.rank, {"stopped": f"{type(exc).__name__}: {exc}"}, tic)
            raise
        return {"release": out.tolist(), "sent": sent, "reduces": reduces[0]}
    if noise == "distributed":  # each party's own share: σ/√2, two honest shares carry σ
        grid = plan_noise(NoiseSpec("gaussian", SIGMA, sensitivity=1.0), DIM, 3).grid_bits
        spec = NoiseSpec("gaussian", SIGMA / math.sqrt(2.0), sensitivity=1.0, grid_bits=grid)
        src: Any = DistributedNoise()
    else:
        spec = NoiseSpec("gaussian", SIGMA, sensitivity=1.0)
        src = InMpcNoise()
    agg = MpcAggregator(src)
    src.prepare(spec, DIM, releases=1)
    out = agg.aggregate(c[None], torch.ones(1, dtype=torch.float64), spec)
    return {"release": out.tolist(), "sent": sent, "reduces": reduces[0]}


def _trial(flip: tuple[int, int, str] | None, noise: str, security: str = "semi-honest") -> dict[str, Any]:
    from mpc_erm.mpc.local import LocalRunError, run_local

    tic = time.perf_counter()
    with tempfile.TemporaryDirectory() as outcomes:
        try:
            reps = run_local(_party, parties=3, trust="replicated", args=(flip, noise, security, outcomes),
                             timeout_s=180, deadline_s=DEADLINE_S)
            failure: LocalRunError | None = None
        except LocalRunError as exc:
            reps, failure = [], exc
        own = {int(f.stem): json.loads(f.read_text()) for f in Path(outcomes).glob("*.json")}
    if security == "malicious":  # judged by the honest parties' own outcomes
        return _judge(own, tic) if failure is not None or any("stopped" in o for o in own.values()) else \
            _released(reps, tic)
    if failure is not None:
        text = str(failure)
        kind = "caught_integrity" if any(k in text for k in ("RevealMismatch", "SamplerStall", "SetupMismatch",
                                                             "IntegrityError", "DeviationDetected")) else "caught_other"
        return {"outcome": kind, "error": failure.summary, "seconds": time.perf_counter() - tic}
    return _released(reps, tic)


def _judge(own: dict[int, dict[str, Any]], tic: float) -> dict[str, Any]:
    """A malicious-mode trial by the two honest parties' own outcomes (a party with none never
    released: it was stuck until its process ended)."""
    honest = [r for r in range(3) if r != DEVIATOR]
    released = [r for r in honest if "release" in own.get(r, {})]
    text = " | ".join(f"party {r}: {own.get(r, {}).get('stopped', 'no outcome (never decided)')}"
                      for r in honest if r not in released)
    if len(released) == len(honest):  # only the deviating party stopped: compare the honest releases
        return _released([own[r] for r in honest], tic)
    if released:
        return {"outcome": "caught_selective", "error": text[:600], "released": released,
                "seconds": time.perf_counter() - tic}
    kind = "caught_integrity" if any(k in text for k in ("Mismatch", "DeviationDetected", "UnanimityFailed")) \
        else "caught_other"
    return {"outcome": kind, "error": text[:600], "seconds": time.perf_counter() - tic}


def _released(reps: list[dict[str, Any]], tic: float) -> dict[str, Any]:
    """Every party (or both honest ones) released: the same value, and how far from the truth."""
    import numpy as np

    truth = sum(np.asarray(_contributions(r)) for r in range(3))
    rel = [np.asarray(r["release"]) for r in reps]
    same = all(np.array_equal(rel[0], x) for x in rel)
    off = float(np.max(np.abs(rel[0] - truth)) / SIGMA)
    kind = "silent_corrupted" if off > FAR else "silent_plausible"
    return {"outcome": kind if same else "split", "max_off_in_sigma": off, "seconds": time.perf_counter() - tic,
            **({"sent": len(reps[DEVIATOR]["sent"]), "ops": reps[DEVIATOR]["sent"],
                "reduces": reps[DEVIATOR]["reduces"]} if len(reps) == 3 and "sent" in reps[DEVIATOR] else {})}


def main(argv: list[str] | None = None) -> None:
    import numpy as np

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default="flip", help="comma-separated: flip, zero, drop, consistent, input (malicious)")
    ap.add_argument("--noise", choices=["mpc", "distributed"], default="mpc")
    ap.add_argument("--security", choices=["semi-honest", "malicious"], default="semi-honest",
                    help="malicious: the verified aggregate, with distributed noise")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    kinds = [k for k in a.kinds.split(",") if k]
    allowed = {"flip", "zero", "drop", "consistent"} | ({"input"} if a.security == "malicious" else set())
    if not kinds or set(kinds) - allowed:
        raise SystemExit(f"--kinds: {', '.join(sorted(allowed))}; got {a.kinds!r}")
    if a.security == "malicious":
        a.noise = "distributed"
    honest = _trial(None, a.noise, a.security)
    if honest["outcome"] != "silent_plausible":
        raise SystemExit(f"the honest run did not give a plausible release: {honest}")
    messages, ops, reduces = int(honest["sent"]), list(honest["ops"]), int(honest["reduces"])
    rng = np.random.default_rng(a.seed)
    trials = []
    for i in range(a.trials):
        k, bit = int(rng.integers(messages)), int(rng.integers(1 << 30))
        kind = kinds[i % len(kinds)] if len(kinds) > 1 else kinds[0]
        op = ops[k]
        if kind == "consistent":  # the k-th of its openings, the same altered share to every party
            k, op = k % reduces, ("all_gather" if a.security == "malicious" else "all_reduce") + " (every recipient)"
        elif kind == "input":
            op = "its own input, beyond its bound, with a forged proof"
        r = _trial((k, bit, kind), a.noise, a.security)
        r.pop("ops", None)
        r.pop("reduces", None)
        trials.append({"trial": i, "kind": kind, "message": k, "op": op, "bit": bit, **r})
        print(f"trial {i}: {kind} message {k} ({op}): {r['outcome']}", flush=True)
    outcomes = ("caught_integrity", "caught_other", "caught_selective", "silent_corrupted", "silent_plausible", "split")
    counts = {k: sum(t["outcome"] == k for t in trials) for k in outcomes}
    by_kind = {kind: {k: sum(t["outcome"] == k for t in trials if t["kind"] == kind) for k in outcomes}
               for kind in kinds}
    by_op = {op: {k: sum(t["outcome"] == k for t in trials if t["op"] == op) for k in outcomes}
             for op in sorted({t["op"] for t in trials})}
    command = "python -m benchmarks.deviation_campaign " + " ".join(sys.argv[1:] if argv is None else argv)
    made = "in-MPC discrete Gaussian" if a.noise == "mpc" else "distributed discrete Gaussian (each party's share)"
    mode = ("malicious-secure with abort (3-party replicated sharing in F_p, proved inputs, verified openings)"
            if a.security == "malicious" else "semi-honest (3-party replicated sharing)")
    out = jsonable({"benchmark": "deviation_campaign", "mode": mode, "security": a.security,
                    "noise": a.noise, "machine": machine_info(), "command": command,
                    "what": (f"one noisy aggregate of known contributions (d = {DIM}, {made}, σ = {SIGMA:g}); party "
                             f"{DEVIATOR} deviates in one outgoing message after set-up ({', '.join(kinds)}, in turn), "
                             f"the message uniform over the {messages} an honest run sends; outcome per trial (module "
                             f"docstring); every wait bounded by {DEADLINE_S:g} s"),
                    "honest_messages": messages, "honest_ops": {op: ops.count(op) for op in sorted(set(ops))},
                    "counts": counts, "by_kind": by_kind, "by_op": by_op, "trials": trials})
    print(json.dumps(counts), flush=True)
    if a.out:
        a.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
