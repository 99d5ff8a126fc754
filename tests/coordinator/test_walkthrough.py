"""docs/tutorials/own-csv.md ("Your own consortium from CSV files"), run as written: the shell blocks between the
walkthrough markers, in a fresh directory, with real daemons from provisioned kits. Only the three
ports are replaced by free ones (so the test cannot collide with another listener).

The transcript (every command with its time) is written to $MPC_ERM_WALKTHROUGH_LOG.own-csv when set.
``run_walkthrough`` runs any tutorial's walkthrough the same way (``test_walkthrough_images.py``).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "docs" / "tutorials" / "own-csv.md"  # the walkthrough tutorial
BIN = Path(sys.executable).parent

pytestmark = [pytest.mark.e2e, pytest.mark.long]  # ~65 s: with the long campaigns (CI runs them)


def walkthrough_script(page: Path = README) -> str:
    """The shell blocks between a tutorial's walkthrough markers, in order."""
    text = page.read_text()
    body = text[text.index("<!-- walkthrough:begin -->"): text.index("<!-- walkthrough:end -->")]
    blocks = re.findall(r"```sh\n(.*?)```", body, flags=re.S)
    assert len(blocks) >= 5, "the walkthrough lost its shell blocks"
    return "\n".join(blocks)


def run_walkthrough(page: Path, tmp_path: Path, ports: tuple[str, ...]) -> tuple[str, float]:
    """Run ``page``'s walkthrough in ``tmp_path`` with ``ports`` replaced by free ones: (its
    transcript, its wall time). It must exit 0; the daemons are killed whatever happened."""
    script = walkthrough_script(page)
    for old, new in zip(ports, _free_ports(len(ports)), strict=True):
        assert old in script
        script = script.replace(old, str(new))
    (tmp_path / "walkthrough.sh").write_text("set -euo pipefail\nPS4='+ [$(date +%T)] '\nset -x\n" + script)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(["bash", "walkthrough.sh"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=900)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the daemons and their workers, whatever happened
        except ProcessLookupError:
            pass
    wall = time.perf_counter() - t0
    log = os.environ.get("MPC_ERM_WALKTHROUGH_LOG")
    if log:
        Path(f"{log}.{page.stem}").write_text(out + f"\n# wall time {wall:.1f} s\n")
    assert proc.returncode == 0, out[-6000:]
    return out, wall


def _free_ports(k: int) -> list[int]:
    socks = [socket.socket() for _ in range(k)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def test_the_readme_walkthrough_goes_from_csv_files_to_predictions(tmp_path: Path) -> None:
    out, wall = run_walkthrough(README, tmp_path, ("7301", "7302", "7303"))
    # the dry run found the job usable; the model came back with its schema; predictions were made
    assert "ok: the noise leaves the signal usable" in out
    acc = re.search(r"accuracy on the (\d+) labelled rows of new.csv: ([0-9.]+)", out)
    assert acc is not None, out[-3000:]
    assert int(acc.group(1)) > 15000 and float(acc.group(2)) > 0.78, acc.group(0)
    preds = (tmp_path / "predictions.csv").read_text().splitlines()
    assert preds[0] == "prediction,probability" and len(preds) == 16281 + 1
    assert {line.split(",")[0] for line in preds[1:]} <= {">50K", "<=50K", ""}
    # the plain-language statements: the job's, saved by job result, and the data set's at alice
    statement = (tmp_path / "results" / "privacy_statement.md").read_text()
    assert "job 'income-model'" in statement and "The unit of privacy is one record" in statement
    spent = re.search(r"\*\*Spent: ε = ([0-9.]+) at δ = 1e-05\*\*", out)
    assert spent is not None and 0.5 < float(spent.group(1)) < 1.0, out[-3000:]  # ε = 1 at δ = 1e-7, at δ = 1e-5
    # no private key outside its own kit, and the CA key in no kit
    keys = sorted(p.relative_to(tmp_path / "kits").as_posix() for p in (tmp_path / "kits").rglob("*.key"))
    assert keys == ["alice/pki/alice.key", "bob/pki/bob.key", "ca/ca.key", "carol/pki/carol.key",
                    "coordinator/pki/coordinator.key"]
    # beside a non-private scikit-learn model of the pooled rows (the same schema's features)
    from sklearn.linear_model import LogisticRegression

    from mpc_erm.data.schema import load_schema, read_csv_with_schema

    schema = load_schema(tmp_path / "schema.toml")
    pooled = [read_csv_with_schema(tmp_path / "mydata" / f"{p}.csv", schema) for p in ("alice", "bob", "carol")]
    held = read_csv_with_schema(tmp_path / "mydata" / "new.csv", schema)
    clf = LogisticRegression(max_iter=2000, fit_intercept=False).fit(
        np.vstack([p.X for p in pooled]), np.concatenate([p.y for p in pooled]))
    pooled_acc = float((clf.predict(held.X) == held.y).mean())
    print(f"\nwalkthrough: held-out accuracy {float(acc.group(2)):.4f} (private, ε = 1) vs {pooled_acc:.4f} "
          f"(scikit-learn, non-private, pooled rows); wall time {wall:.0f} s")
    assert float(acc.group(2)) > pooled_acc - 0.04  # T = 50 rounds stop short of the optimum (dry run)
