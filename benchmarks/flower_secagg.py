"""Flower 1.42's SecAgg+ beside this product's secure aggregation with its noise, per round, same machine.

    python -m benchmarks.flower_secagg --flower-venv /path/to/venv --out benchmarks/results/flower_secagg.json

**Flower** runs its deployment engine as a user would: one ``flower-superlink`` and three
``flower-supernode`` processes on loopback (insecure: Flower's TLS is off here, ours stays on), and a
Flower App submitted with ``flwr run`` whose ServerApp runs FedAvg through the ``SecAggPlusWorkflow``
(3 shares, reconstruction threshold 2) and whose ClientApp, behind ``secaggplus_mod``, contributes a
random D-vector each round. A round's seconds are the strategy's, from asking for fits to the
aggregate (the app prints them). Flower adds no DP noise here.

**Ours**: :func:`benchmarks.aggregate.run_streamed` with ``as_job``: three parties over gRPC with
mutual TLS, every round's noise the discrete Gaussian sampled inside the MPC that a 1,000-round
logistic gradient job at ε = 1 gets (its grid, σ and coin bits), streamed one round ahead, and the
secure sum; a round's seconds are the whole pipeline's over the rounds run (noise included).
``--noise mpc,distributed`` also runs the same job with ``privacy.noise = "distributed"`` (each
party's own share, sized so the two honest parties' shares carry the guarantee: √(3/2) times the
noise), the product's declared option, reported beside the in-MPC sampler, never in its place.

Flower is not a dependency of the product. The script looks for ``flwr``, ``flower-superlink`` and
``flower-supernode`` in ``--flower-venv``/bin or on PATH and, when they are missing or not 1.42,
writes a result that says it skipped and why (exit status 0). Flower 1.42 installs with
``python -m venv V && V/bin/pip install flwr==1.42.0 numpy``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.aggregate import jsonable, machine_info, run_streamed, write_result

FLOWER_VERSION = "1.42"
LINK_PORT = 8000  # flower-superlink 1.42 serves its Fleet, Control and Runtime APIs on one HTTP port
NODE_PORTS = (9094, 9095, 9096)
ROUND_LINE = re.compile(r"FLBENCH round (\d+) results (\d+) failures (\d+) seconds ([0-9.]+)")

PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "flbench"
version = "1.0.0"
description = "SecAgg+ rounds of random vectors (mpc_erm benchmark)"
license = "Apache-2.0"
dependencies = ["flwr==1.42.0", "numpy"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "mpcerm"

[tool.flwr.app.components]
serverapp = "flbench.server:app"
clientapp = "flbench.client:app"

[tool.flwr.app.config]
num-rounds = 3
dim = 100000
nodes = 3
"""

CLIENT = '''"""Contributes a random D-vector through SecAgg+."""
import numpy as np
from flwr.client import ClientApp, NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.common import Context


class Contributor(NumPyClient):
    def __init__(self, dim, seed):
        self.dim, self.rng = dim, np.random.default_rng(seed)

    def fit(self, parameters, config):
        return [self.rng.uniform(-1.0, 1.0, self.dim).astype(np.float32)], 1, {}


def client_fn(context: Context):
    return Contributor(int(context.run_config["dim"]), int(context.node_id % 2**31)).to_client()


app = ClientApp(client_fn=client_fn, mods=[secaggplus_mod])
'''

SERVER = '''"""FedAvg through the SecAgg+ workflow; prints each round's seconds."""
import time

import numpy as np
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

app = ServerApp()


class TimedFedAvg(FedAvg):
    def configure_fit(self, server_round, parameters, client_manager):
        self._tic = time.perf_counter()
        return super().configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(self, server_round, results, failures):
        out = super().aggregate_fit(server_round, results, failures)
        print(f"FLBENCH round {server_round} results {len(results)} failures {len(failures)} "
              f"seconds {time.perf_counter() - self._tic:.4f}", flush=True)
        return out


@app.main()
def main(grid: Grid, context: Context) -> None:
    rounds, dim, nodes = (int(context.run_config[k]) for k in ("num-rounds", "dim", "nodes"))
    strategy = TimedFedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=nodes, min_available_clients=nodes,
                           initial_parameters=ndarrays_to_parameters([np.zeros(dim, dtype=np.float32)]))
    legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=rounds), strategy=strategy)
    DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(num_shares=nodes, reconstruction_threshold=nodes - 1))(grid, legacy)
'''


def find_flower(venv: Path | None) -> tuple[dict[str, str] | None, str]:
    """(paths of flwr, flower-superlink, flower-supernode; the version) or (None, why not)."""
    where = [str(venv / "bin")] if venv is not None else os.environ.get("PATH", "").split(os.pathsep)
    tools: dict[str, str] = {}
    for name in ("flwr", "flower-superlink", "flower-supernode"):
        found = shutil.which(name, path=os.pathsep.join(where))
        if found is None:
            place = f"--flower-venv {venv}" if venv else "PATH"
            return None, f"{name} not found in {place}: Flower is not installed"
        tools[name] = found
    out = subprocess.run([tools["flwr"], "--version"], capture_output=True, text=True, timeout=60)
    version = re.search(r"(\d+\.\d+\.\d+)", out.stdout + out.stderr)
    if version is None or not version.group(1).startswith(FLOWER_VERSION + "."):
        found_version = version.group(1) if version else "(unknown)"
        return None, f"Flower {found_version} found; this benchmark drives {FLOWER_VERSION}"
    return tools, version.group(1)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def run_flower(tools: dict[str, str], dims: list[int], rounds: int, say: Any) -> dict[int, dict[str, Any]]:
    """Rounds of SecAgg+ per D through one SuperLink and three SuperNodes (module docstring)."""
    busy = [p for p in (LINK_PORT, *NODE_PORTS) if not _port_free(p)]
    if busy:
        raise RuntimeError(f"ports {busy} are in use: Flower's SuperLink and SuperNodes need them")
    work = Path(tempfile.mkdtemp(prefix="flower-secagg-"))
    app = work / "app"
    (app / "flbench").mkdir(parents=True)
    (app / "pyproject.toml").write_text(PYPROJECT)
    (app / "flbench" / "__init__.py").write_text("")
    (app / "flbench" / "client.py").write_text(CLIENT)
    (app / "flbench" / "server.py").write_text(SERVER)
    home = work / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
                                      f'address = "127.0.0.1:{LINK_PORT}"\ninsecure = true\n')
    env = {**os.environ, "FLWR_HOME": str(home),
           "PATH": os.pathsep.join([str(Path(tools["flwr"]).parent), os.environ.get("PATH", "")])}
    procs: list[subprocess.Popen[bytes]] = []
    out: dict[int, dict[str, Any]] = {}
    try:
        procs.append(subprocess.Popen([tools["flower-superlink"], "--insecure"], env=env, cwd=work,
                                      stdout=(work / "superlink.log").open("wb"), stderr=subprocess.STDOUT,
                                      start_new_session=True))
        time.sleep(5)
        for i, port in enumerate(NODE_PORTS):
            procs.append(subprocess.Popen(
                [tools["flower-supernode"], "--insecure", "--superlink", f"127.0.0.1:{LINK_PORT}", "--port", str(port),
                 "--node-config", f"partition-id={i}"], env=env, cwd=work,
                stdout=(work / f"supernode{i}.log").open("wb"), stderr=subprocess.STDOUT, start_new_session=True))
        time.sleep(8)
        for dim in dims:
            say(f"Flower SecAgg+: D = {dim}, {rounds} rounds …")
            tic = time.perf_counter()
            res = subprocess.run([tools["flwr"], "run", str(app), "local", "--stream", "--run-config",
                                  f"num-rounds={rounds} dim={dim}"], env=env, cwd=work, capture_output=True,
                                 text=True, timeout=max(600, 120 * rounds))
            wall = time.perf_counter() - tic
            rows = [(int(r), int(ok), int(bad), float(s)) for r, ok, bad, s in ROUND_LINE.findall(res.stdout)]
            if len(rows) != rounds or any(ok != 3 or bad for _, ok, bad, _ in rows):
                tail = (res.stdout + res.stderr)[-2000:]
                raise RuntimeError(f"Flower run at D = {dim} did not finish {rounds} rounds of 3 results:\n{tail}")
            secs = [s for *_, s in rows]
            out[dim] = {"round_seconds": secs, "median_round_seconds": statistics.median(secs),
                        "flwr_run_wall_seconds": wall}
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)
    return out


def run(dims: list[int], *, flower_venv: Path | None, flower_rounds: int, our_rounds: dict[int, int], trust: str,
        say: Any, kinds: tuple[str, ...] = ("mpc",)) -> dict[str, Any]:
    result: dict[str, Any] = {"benchmark": "flower_secagg", "machine": machine_info(), "dims": dims}
    tools, version = find_flower(flower_venv)
    if tools is None:
        result.update(skipped=True, reason=version)
        return result
    result["flower"] = {"version": version, "engine": "deployment: 1 flower-superlink + 3 flower-supernode "
                        "processes on loopback, insecure (no TLS), FedAvg through SecAggPlusWorkflow (3 shares, "
                        "threshold 2), no DP noise", "per_dim": run_flower(tools, dims, flower_rounds, say)}
    met: dict[str, dict[int, bool]] = {}
    for kind in kinds:
        ours: dict[int, dict[str, Any]] = {}
        for dim in dims:
            rounds, job_rounds, why = our_rounds.get(dim, 5), 1000, None
            while True:  # the longest job (from 1,000 rounds, halving) whose noise the product can realise
                say(f"ours: D = {dim}, {rounds} rounds, {kind} noise as a {job_rounds}-round job's, trust {trust} …")
                try:
                    r = run_streamed(3, dim, rounds, as_job=True, job_rounds=job_rounds, trust=trust, kind=kind)
                    break
                except ValueError as exc:  # the sampler's TV budget (raised before any party starts)
                    if "total-variation" not in str(exc) or job_rounds <= 1:
                        raise
                    why = f"a {job_rounds}-round job's noise cannot be realised: {exc}"
                    job_rounds //= 2
            ours[dim] = {"rounds": rounds, "round_seconds_with_noise": r["total_s"] / rounds, "noise_s": r["noise_s"],
                         "online_p50_s": r["online_p50_s"], "noise_plan": r["parameters"]["as_job"],
                         "trust_model": r["trust_model"], "job_rounds": job_rounds,
                         **({"shorter_job_because": why} if why else {})}
        suffix = "" if kind == "mpc" else f"_{kind}"
        noise = ("the in-MPC discrete Gaussian" if kind == "mpc" else
                 "each party's own discrete Gaussian share (privacy.noise = \"distributed\", one party may be corrupt)")
        result[f"ours{suffix}"] = {"what": f"3 parties over gRPC with mutual TLS; per round: {noise} a 1,000-round "
                                           "logistic gradient job at ε = 1 gets, streamed, and the secure sum "
                                           "(benchmarks.aggregate --streamed --as-job)", "per_dim": ours}
        ratio = {dim: result["flower"]["per_dim"][dim]["median_round_seconds"] / ours[dim]["round_seconds_with_noise"]
                 for dim in dims}
        result[f"flower_over_ours{suffix}_per_round"] = ratio
        met[kind] = {dim: ratio[dim] >= 5.0 for dim in dims}
    result["target"] = {"goal": ">= 5x faster per round than Flower at D = 1e5 and 1e6, our noise counted",
                        "met": met["mpc"] if "mpc" in met else None,
                        "met_by_noise": met}
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="100000,1000000", help="comma-separated D")
    ap.add_argument("--flower-venv", type=Path, help="a virtual environment with flwr 1.42 (default: PATH)")
    ap.add_argument("--flower-rounds", type=int, default=3)
    ap.add_argument("--our-rounds", default="100000:20,1000000:5", help="D:rounds for our pipeline")
    ap.add_argument("--trust", default="replicated", help="our trust model (replicated or dealer)")
    ap.add_argument("--noise", default="mpc", help="our noise, comma-separated: mpc (sampled inside the MPC), "
                                                   "distributed (each party's own share)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    dims = [int(x) for x in a.dims.split(",")]
    our_rounds = {int(k): int(v) for k, v in (kv.split(":") for kv in a.our_rounds.split(","))}
    kinds = tuple(k.strip() for k in a.noise.split(","))
    if not set(kinds) <= {"mpc", "distributed"}:
        ap.error(f"--noise: mpc and/or distributed, not {a.noise!r}")
    res = run(dims, flower_venv=a.flower_venv, flower_rounds=a.flower_rounds, our_rounds=our_rounds, trust=a.trust,
              say=lambda m: print(m, file=sys.stderr, flush=True), kinds=kinds)
    res["command"] = " ".join(["python -m benchmarks.flower_secagg", *(argv if argv is not None else sys.argv[1:])])
    write_result(jsonable(res), a.out)


if __name__ == "__main__":
    main()
