"""``python -m benchmarks aggregate|sampler|e2e``: benchmarks of the MPC engine with real party
processes on this machine, each writing the JSON the docs quote (``--out FILE``; docs/how-to/benchmarks.md).

Benchmarks are a leaf: they use the product (``mpc_erm``, ``parties``, ``coordinator``), the
product never imports them, so ``mpc-erm`` has no ``bench`` command. Nothing heavy is imported here
(``--help`` must answer without torch); each command imports its benchmark module when it runs.
Errors are one line and a non-zero exit, as in ``mpc-erm``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

TRUSTS = ("dealer", "replicated", "tfp")
TRUST_HELP = ("triples from a dealer process (default); replicated: CrypTen 3-party RSS, hardened, no dealer "
              "(the parties make the comparisons' triples); tfp: party 0 makes the triples (benchmarks/tests only)")


def _emit(result: dict[str, Any], out: Path | None, as_json: bool, summary: Any) -> None:
    text = json.dumps(result, indent=1)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    if as_json:
        click.echo(text)
        return
    summary(result)
    if out is not None:
        click.echo(f"wrote {out}")


def _guard(fn: Any, show_traceback: bool) -> Any:
    """Run a benchmark; a failing child becomes one line (its traceback only on request)."""
    from mpc_erm.mpc.local import LocalRunError

    try:
        return fn()
    except LocalRunError as exc:
        if show_traceback:
            click.echo(str(exc), err=True)
        hint = "" if show_traceback else " (--traceback shows the child's traceback)"
        raise click.ClickException(f"{exc.summary}{hint}") from None


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x * 1e3:.2f} ms" if x < 1 else f"{x:.3f} s"


def _common(f: Any) -> Any:
    for opt in reversed([
        click.option("--trust", type=click.Choice(TRUSTS), default="dealer", show_default=True, help=TRUST_HELP),
        click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=7200.0, show_default=True,
                     help="seconds for the whole run; every process is killed after"),
        click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="also write the JSON here"),
        click.option("--json", "as_json", is_flag=True, help="print the result as JSON"),
        click.option("--traceback", "show_traceback", is_flag=True, help="print a failing party's traceback"),
    ]):
        f = opt(f)
    return f


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def cli() -> None:
    """Benchmarks of the MPC engine (party processes over gRPC + mTLS on this machine)."""


@cli.command("aggregate")
@click.option("--parties", "-m", type=click.IntRange(2, 64), default=3, show_default=True)
@click.option("--dim", "-d", type=click.IntRange(min=1), default=122, show_default=True, help="coordinates D")
@click.option("--rounds", "-r", type=click.IntRange(min=1), default=20, show_default=True,
              help="counted rounds (one warm-up round more)")
@click.option("--noise", type=click.Choice(["gaussian", "laplace", "none"]), default="gaussian", show_default=True,
              help="in-MPC noise from the offline pool; none: zero noise (no privacy, comparisons only)")
@click.option("--sigma", "scale", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="σ (gaussian) or b (laplace), real units")
@click.option("--sensitivity", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Δ of the release (picks the fixed-point grid)")
@click.option("--crypten-rounds", type=click.IntRange(min=0),
              help="rounds of the CrypTen/gloo baseline (default: what fits ~2 min; randn(10^6) takes ~60 s; 0 skips)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--streamed", is_flag=True,
              help="time a job's whole pipeline instead: noise streamed one round ahead, then each round's aggregate")
@click.option("--as-job", "job_rounds", type=click.IntRange(min=1), metavar="T",
              help="with --streamed: the noise a gradient job of D coordinates and T rounds gets (its grid, σ, "
                   "coin bits; ε = 1, δ = 1e-5), instead of --sigma/--sensitivity")
@_common
def aggregate_cmd(parties: int, dim: int, rounds: int, noise: str, scale: float, sensitivity: float,
                  crypten_rounds: int | None, seed: int, streamed: bool, job_rounds: int | None, trust: str,
                  timeout_s: float, out: Path | None, as_json: bool, show_traceback: bool) -> None:
    """Per-round latency of the noisy secure aggregate, beside a raw gRPC exchange and CrypTen over gloo
    (``--streamed``: the wall time of a job's noise and rounds together)."""
    from benchmarks.aggregate import run, run_streamed

    echo = (lambda _m: None) if as_json else (lambda m: click.echo(m, err=True))
    if streamed:
        result = _guard(lambda: run_streamed(parties, dim, rounds, noise=noise, scale=scale, sensitivity=sensitivity,
                                             trust=trust, seed=seed, timeout_s=timeout_s, progress=echo,
                                             as_job=job_rounds is not None, job_rounds=job_rounds),
                        show_traceback)
        _emit(result, out, as_json, _streamed_summary)
        return
    result = _guard(lambda: run(parties, dim, rounds, noise=noise, scale=scale, sensitivity=sensitivity, trust=trust,
                                crypten_rounds=crypten_rounds, seed=seed, timeout_s=timeout_s, progress=echo),
                    show_traceback)
    _emit(result, out, as_json, _aggregate_summary)


def _streamed_summary(r: dict[str, Any]) -> None:
    p = r["parameters"]
    mib = 2**20
    click.echo(f"aggregate --streamed: M={p['parties']} D={p['dim']} × {p['rounds']} rounds, noise {p['noise']}; "
               f"{r['trust_model']}")
    job = p.get("as_job")
    if job:
        click.echo(f"  noise of a {job['rounds_planned']}-round job: σ = {job['noise_scale_grid']:,.0f} grid units "
                   f"(2^-{job['grid_bits']}), {job['coin_bits']}-bit coins")
    click.echo(f"  total {r['total_s']:.1f} s ({r['samples_per_second_pipeline']:,.0f} noise samples/s through the "
               f"pipeline): noise {r['noise_s']:.1f} s, online {r['online_s']:.1f} s (p50 {_fmt_s(r['online_p50_s'])})")
    click.echo(f"  first round ready after {r['first_round_ready_s']:.2f} s; noise pool peak "
               f"{r['peak_pool_bytes'] / mib:.1f} MiB; party RSS "
               f"{r['rss_before_noise_bytes_max_over_parties'] / mib:.0f} MiB before the noise, peak "
               f"{r['peak_rss_bytes_max_over_parties'] / mib:.0f} MiB")


def _aggregate_summary(r: dict[str, Any]) -> None:
    p = r["parameters"]
    click.echo(f"aggregate: M={p['parties']} D={p['dim']} noise {p['noise']}, {p['rounds']} rounds; "
               f"{r['ours']['trust_model']}")
    rows = [("ours (gRPC+mTLS, MPC)", r["ours"]["latency"]), ("raw gRPC floor", r["raw_grpc_floor"]["latency"]),
            ("CrypTen over gloo", r["crypten_gloo"].get("latency", {}))]
    for name, lat in rows:
        click.echo(f"  {name:24s} p50 {_fmt_s(lat.get('p50_s'))}  p95 {_fmt_s(lat.get('p95_s'))}  "
                   f"({lat.get('rounds', 0)} rounds)")
    off = r["ours"].get("offline")
    if off:
        click.echo(f"  offline noise: {off['samples']} samples in {off['seconds']:.2f} s "
                   f"({off['samples_per_second']:,.0f}/s)")
    ra = r["ratios"]

    def ratio(x: float | None) -> str:
        return "—" if x is None else f"{x:.3g}x"

    click.echo(f"  ours/floor {ratio(ra['ours_over_floor_p50'])}, "
               f"ours/CrypTen-gloo {ratio(ra['ours_over_crypten_gloo_p50'])}")
    for t in r["targets"]:
        if t["applies"]:
            click.echo(f"  target {t['target']}: {'met' if t['met'] else 'NOT met'}")


@cli.command("sampler")
@click.option("--mechanism", type=click.Choice(["gaussian", "laplace"]), default="gaussian", show_default=True)
@click.option("--samples", "-n", type=click.IntRange(min=0), default=100_000, show_default=True,
              help="MPC samples (offline pool); revealed for measurement only")
@click.option("--parties", "-m", type=click.IntRange(2, 64), default=3, show_default=True)
@click.option("--scale", "--sigma", "scale", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True, help="σ (gaussian) or b (laplace), real units")
@click.option("--grid-bits", type=click.IntRange(0, 40),
              help="grid 2^-g (default: the product's plan, scale ≈ 2^14 grid units)")
@click.option("--randn-samples", type=click.IntRange(min=0), default=10_000, show_default=True,
              help="crypten.randn samples in the same session (~60 s per 10^6; 0 skips)")
@click.option("--reference-samples", type=click.IntRange(min=0), default=1_000_000, show_default=True,
              help="plaintext reference sampler draws (same algorithm; fast)")
@click.option("--batch", type=click.IntRange(min=1),
              help="pool batch size (default: InMpcNoise's, 2^15; 2^12 for gaussian)")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the plaintext reference")
@click.option("--device", default="cpu", show_default=True,
              help="where each party's sampler computes: cpu, or cuda on a GPU machine")
@_common
def sampler_cmd(mechanism: str, samples: int, parties: int, scale: float, grid_bits: int | None, randn_samples: int,
                reference_samples: int, batch: int | None, seed: int, device: str, trust: str, timeout_s: float,
                out: Path | None, as_json: bool, show_traceback: bool) -> None:
    """Offline cost and accuracy of the in-MPC noise sampler, beside crypten.randn and the plaintext reference."""
    from benchmarks.sampler import run

    echo = (lambda _m: None) if as_json else (lambda m: click.echo(m, err=True))
    result = _guard(lambda: run(mechanism, samples, parties=parties, trust=trust, scale=scale, grid_bits=grid_bits,
                                randn_samples=randn_samples, reference_samples=reference_samples, batch=batch,
                                seed=seed, timeout_s=timeout_s, progress=echo, device=device), show_traceback)
    _emit(result, out, as_json, _sampler_summary)


def _sampler_summary(r: dict[str, Any]) -> None:
    p = r["parameters"]
    click.echo(f"sampler {p['mechanism']} scale {p['scale']:g} on grid 2^-{p['grid_bits']}, M={p['parties']} "
               f"({p['trust']})")
    for key, name in (("mpc", "MPC sampler"), ("crypten_randn", "crypten.randn"), ("reference", "reference")):
        block = r.get(key)
        if not block:
            continue
        st = block["stats"]
        rate = block.get("samples_per_second")
        rate_s = f"{rate:,.0f} samples/s, " if rate else ""
        click.echo(f"  {name:14s} n={st['n']:,}: {rate_s}KS {st.get('ks_continuous', float('nan')):.2e} "
                   f"(iid median {st['ks_iid_median']:.1e}), std err {st.get('rel_std_error', float('nan')):+.2e}, "
                   f"max|z| {st.get('max_abs_z', float('nan')):.2f}")
    ceilings = r.get("ceilings")
    if ceilings:
        m = ceilings["measured"]
        click.echo(f"  this machine, same run: one message step {m['latency_s'] * 1e3:.1f} ms, transport "
                   f"{m['transport_bytes_per_s'] / 2**20:,.0f} MiB/s, local Beaver AND "
                   f"{m['and_words_per_s'] * 64 / 1e9:.1f} G gates/s per core")
        for key in ("compute", "bytes", "latency", "cpu"):
            c = ceilings.get(key)
            if c and c["samples_per_second"]:
                click.echo(f"  {key:8s} ceiling {c['samples_per_second']:>12,.0f} samples/s, reached "
                           f"{c['fraction_reached']:.0%} ({c['what']})")
    for t in r["targets"]:
        if t["applies"]:
            click.echo(f"  target {t['target']}: {'met' if t['met'] else 'NOT met'}")


@cli.command("e2e")
@click.option("--trust", type=click.Choice(["dealer", "replicated"]), default="dealer", show_default=True)
@click.option("--iterations", type=click.IntRange(1, 2000), default=50, show_default=True,
              help="T of the gradient job")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="also write the JSON here")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
def e2e_cmd(trust: str, iterations: int, out: Path | None, as_json: bool) -> None:
    """The demo's jobs across real daemons: accuracy vs non-private, time per round vs the simulator."""
    from benchmarks.e2e import run

    echo = (lambda _m: None) if as_json else (lambda m: click.echo(m, err=True))
    _emit(run(trust=trust, iterations=iterations, progress=echo), out, as_json, _e2e_summary)


def _e2e_summary(r: dict[str, Any]) -> None:
    p = r["parameters"]
    click.echo(f"e2e: {p['dataset']}, {p['parties']} parties ({p['trust']}), real daemons")
    for j in r["jobs"]:
        if j["status"] != "succeeded":
            click.echo(f"  {j['job']}: {j['status']} ({j['reason']})")
            continue
        click.echo(f"  {j['job']:16s} acc {j['accuracy']:.4f} (non-private {j['nonprivate_accuracy']:.4f}, "
                   f"gap {j['accuracy_gap_points']:.2f} pts)  ε {j['epsilon']:.4f}  wall {j['wall_s']:.1f} s  "
                   f"online {_fmt_s(j['online']['seconds_per_round'])}/round  offline noise "
                   f"{j['offline_noise']['samples']} samples in {j['offline_noise']['seconds']:.1f} s")
    b = r["baseline_plaintext_gradient"]
    click.echo(f"  simulator (plaintext) gradient: acc {b['accuracy']:.4f}, {_fmt_s(b['seconds_per_round'])}/round")
    for k, v in r["ratios"].items():
        click.echo(f"  {k}: {v:.3g}x")
    for t in r["targets"]:
        click.echo(f"  target {t['target']}: {'met' if t['met'] else 'NOT met'}")


def main() -> None:
    from coordinator.cli.errors import run_guarded

    run_guarded(cli)


if __name__ == "__main__":
    main()
