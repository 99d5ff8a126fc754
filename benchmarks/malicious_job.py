"""A whole job through real daemons, semi-honest and malicious-secure, in the same run: the demo's
gradient-perturbation job on UCI Adult (logistic regression, 50 rounds, ε = 1), three replicated
party daemons with distributed noise.

    python -m benchmarks.malicious_job --out benchmarks/results/malicious_job.json

Reported per security model: wall seconds from submission to the end, seconds per round (the
job's rounds over that wall time), test accuracy of the released model, ε; and the ratios
malicious ÷ semi-honest. Each run starts its own consortium (3 daemons, a fresh CA, gRPC with
mutual TLS on loopback).
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

PARTIES = ["alice", "bob", "carol"]


def run(security: str, work: Path, iterations: int) -> dict[str, Any]:
    from coordinator.consortium import LocalConsortium
    from coordinator.end_to_end import LocalJob, job_toml

    job = LocalJob(f"adult-{security}", "gradient", lam=1e-4, iterations=iterations, learning_rate=20.0)
    text = job_toml(job, PARTIES, "adult", "replicated", None).replace(
        'accountant = "rdp"', 'accountant = "rdp"\nnoise = "distributed"')
    if security == "malicious":
        text = text.replace('trust = "replicated"', 'trust = "replicated"\nsecurity = "malicious"')
    path = work / f"{security}.toml"
    path.write_text(text)
    with LocalConsortium(work / security, dealer=False, device="cpu") as cons:
        with cons.client() as client:
            tic = time.monotonic()
            job_id = client.submit(path)["job_id"]
            for _ in client.watch(job_id):
                pass
            wall = time.monotonic() - tic
            status = {m: v["status"] for m, v in client.status(job_id).items() if m in PARTIES}
            if set(status.values()) != {"succeeded"}:
                raise RuntimeError(f"{security}: the job did not succeed: {status}")
            client.result(job_id, work / f"{security}-result")
    metrics = json.loads((work / f"{security}-result" / "metrics.json").read_text())
    accuracy = metrics.get("test", {}).get("accuracy")
    report = json.loads((work / f"{security}-result" / "privacy_report.json").read_text())
    return {"wall_seconds": wall, "seconds_per_round": wall / iterations, "test_accuracy": accuracy,
            "epsilon": report["epsilon"], "security": report.get("security"), "trust_model": report["trust_model"]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="malicious-job-") as tmp:
        runs = {sec: run(sec, Path(tmp), a.iterations) for sec in ("semi-honest", "malicious")}
    command = "python -m benchmarks.malicious_job " + " ".join(sys.argv[1:] if argv is None else argv)
    out = jsonable({"benchmark": "malicious_job", "machine": machine_info(), "command": command,
                    "what": ("the demo's gradient job on UCI Adult (logistic, 50 rounds, ε = 1) through 3 replicated "
                             "party daemons with distributed noise, semi-honest and malicious-secure, same run; wall "
                             "seconds from submission to the end (start-up included)"),
                    "runs": runs,
                    "malicious_over_semi_honest_wall": runs["malicious"]["wall_seconds"]
                    / runs["semi-honest"]["wall_seconds"],
                    "accuracy_difference": runs["malicious"]["test_accuracy"] - runs["semi-honest"]["test_accuracy"]})
    print(json.dumps({k: v for k, v in out.items() if k not in ("machine",)}, indent=1, default=str))
    if a.out:
        a.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
