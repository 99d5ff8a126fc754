"""`mpc-erm job plan JOB.toml`: the dry run before ε is spent — no daemon, no reservation.

It prints the privacy plan a daemon would make (mechanism, σ per coordinate next to the signal it
must carry, ε by each accountant) and, with stand-in rows (a schema and one CSV per party:
synthetic, public, or the user's own, read here only), the job's own protocol run in process a
few times, scored on a held-out file next to the non-private model of the same objective (for a
network: the same clipped rounds without noise). Linear models and networks on tabular rows; for a
job with data owners (``job.owners``) the stand-in rows are dealt to its owners, and a federated
job (DP-Fed-LS) is forecast by its own rounds: owners drawn, local epochs, the noisy smoothed mean.

It leaves its verdict beside the job file (``JOB.plan.json``: the job's spec digest, the figures,
no rows), which ``job submit`` reads: a job its dry run found hopeless is sent only with ``--yes``.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import click

RECEIPT_SUFFIX = ".plan.json"


def receipt_path(job_file: Path) -> Path:
    """Where ``job plan`` leaves its verdict on ``job_file``: beside it, ``<stem>.plan.json``."""
    return job_file.with_name(job_file.stem + RECEIPT_SUFFIX)


def write_receipt(job_file: Path, spec_digest: str, summary: dict[str, Any], data: tuple[Path, ...]) -> Path | None:
    """Record the dry run's verdict for this exact job (by its spec digest); None if the job's
    folder cannot be written (the dry run still printed its verdict)."""
    path = receipt_path(job_file)
    body = {"spec_digest": spec_digest, "planned_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "stand_in_files": [p.name for p in data], **summary}
    try:
        path.write_text(json.dumps(body, indent=2, default=float) + "\n")
    except OSError:
        return None
    return path


def stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


def check_before_submit(job_file: Path, jf: Any, *, yes: bool) -> str | None:
    """``job submit``'s look before anything is sent: raises SystemExit(3) for a job that is
    hopeless unless ``yes`` (or the user confirms at a terminal); otherwise one line to show.

    Hopeless by the job's dry run (``JOB.plan.json`` for this exact spec), or, for a job never
    planned, by its noise floor: the least noise/signal it can have on any data, from the job
    file alone (:func:`~mpc_erm.privacy.noise_floor.noise_floor`)."""
    path = receipt_path(job_file)
    try:
        receipt = json.loads(path.read_text())
    except (OSError, ValueError):
        receipt = None
    if receipt is not None and receipt.get("spec_digest") == jf.spec_digest():
        if not receipt.get("hopeless"):
            band = receipt.get("private_mean")
            return (f"dry run ({receipt.get('planned_at', '?')}): {receipt.get('verdict', 'ok')}"
                    + (f"; simulated {receipt.get('metric')} {band:.4f}" if isinstance(band, (int, float)) else ""))
        return _gate(f"the dry run of this job ({path.name}, {receipt.get('planned_at', '?')}) says "
                     f"{receipt.get('verdict')}. Its whole ε would be spent on a model no better than noise.", yes)
    from mpc_erm.privacy.noise_floor import HOPELESS_NOISE_TO_SIGNAL, noise_floor

    floor = noise_floor(jf.spec, features=jf.job.features)  # None where only the agreement's counts fix σ
    if floor is not None and floor.hopeless:
        many = (" Many noisy rounds can still average it down, so its dry run decides: `mpc-erm job plan` forecasts "
                "the job, and a forecast that trains lets it through." if floor.method == "gradient" else "")
        return _gate(f"this job was never planned and is likely hopeless on any data: {floor.describe()} (more than "
                     f"{HOPELESS_NOISE_TO_SIGNAL:g}).{many} A larger ε, more records (privacy.public_n), fewer "
                     "parameters, fewer rounds or a smaller sampling rate would help.", yes)
    stale = receipt is not None
    if not stale and not stderr_is_terminal():  # advice for a person at a terminal, not for scripts
        return None
    first = (f"{path.name} is the dry run of another version of this job: run `mpc-erm job plan` again" if stale else
             f"no dry run of this job: `mpc-erm job plan {job_file.name} --schema … --data …` forecasts its "
             "accuracy before any ε is spent")
    if floor is not None:
        return first + f"; from the job file alone: {floor.describe()}"
    if jf.job.owners:
        return first
    from mpc_erm.privacy.noise_floor import least_rows

    # replace-one: σ follows the agreed counts, so the floor is stated as the rows it needs
    need = least_rows(jf.spec, parties=len(jf.job.parties), features=jf.job.features)
    return first + ("" if need is None else f"; from the job file alone: hopeless on any data unless the parties "
                                            f"hold at least {need:,} rows in all (noise/signal ≤ "
                                            f"{HOPELESS_NOISE_TO_SIGNAL:g} at best)")


def _gate(warning: str, yes: bool) -> str:
    """Let a hopeless job through with --yes or a confirmation at a terminal; else exit 3."""
    if yes:
        return f"warning: {warning} Submitted anyway (--yes)."
    if sys.stdin.isatty() and click.confirm(f"{warning} Submit anyway?", default=False, err=True):
        return "submitted despite the warning"
    click.echo(f"error: {warning} Nothing was sent; to submit anyway, pass --yes.", err=True)
    raise SystemExit(3)


def load_parts(schema_path: Path, data: tuple[Path, ...]) -> tuple[Any, list[Any]]:
    from mpc_erm.data.schema import load_schema, read_csv_with_schema

    schema = load_schema(schema_path)
    return schema, [read_csv_with_schema(p, schema) for p in data]


def levers(fc: Any) -> str:
    """What would buy this job more signal per unit of noise, most effective first for its kind."""
    out = []
    if fc.method == "gradient" and fc.sampling_rate < 1.0:
        z = "" if fc.noise_multiplier is None else f" (z = {fc.noise_multiplier:.3g} here grows with both)"
        out.append(f"a smaller training.sampling_rate or fewer training.iterations{z}")
    elif fc.method == "gradient" and fc.rounds > 1:
        out.append("fewer training.iterations (each round takes its share of ε)")
    out.append("a larger ε")
    out.append("more rows (owners)" if fc.federated else "more rows")
    out.append("fewer features or parameters")
    if fc.method == "output":
        out.append("a larger model.lam")
    return ", ".join(out[:-1]) + " or " + out[-1]


def verdict(fc: Any) -> str:
    """One line a user acts on. It follows the forecast's own runs (their mean against a constant
    predictor and against the same rounds without noise); the noise/signal ratio decides only for
    a forecast without runs."""
    if fc.untrained:
        knobs = ("federated.local_lr, federated.local_epochs, training.learning_rate (the global step) and "
                 "training.iterations" if fc.federated else
                 "training.learning_rate (smaller if it diverges) and training.iterations")
        return ("HOPELESS, and not for privacy: without noise the same rounds do no better than a constant "
                f"either; tune {knobs}")
    band = fc.band()
    if fc.hopeless:
        if band is None:
            return f"HOPELESS: the noise is {fc.noise_to_signal:.1f}× the signal; {levers(fc)} would help"
        return (f"HOPELESS: the simulated private models ({fc.metric} {band[0]:.4f}) do no better than predicting "
                f"a constant ({fc.trivial:.4f}); the noise is {fc.noise_to_signal:.1f}× the signal; {levers(fc)} "
                "would help")
    where = ""
    if band is not None and fc.recovered is not None:
        ref = "the same rounds without noise" if fc.noise_free is not None else "the non-private model"
        where = f": {fc.metric} {band[0]:.4f}, {100 * fc.recovered:.0f} % of the way from a constant to {ref}"
    if fc.weak:
        return f"WEAK{where}; {levers(fc)} would help"
    if fc.short_of_optimum:
        return (f"ok: the noise leaves the signal usable{where}; without noise the rounds reach {fc.noise_free:.4f} "
                f"of the optimum's {fc.nonprivate:.4f}: more training.iterations would help (or a larger "
                "learning_rate, while the rounds still converge)")
    return f"ok: the noise leaves the signal usable{where}"


def security_line(trust: str, security: str, parties: int, owners: bool = False) -> str:
    """Who must not collude, and what the compute parties are assumed to do, in one line
    (``owners``: a job with data owners, whose inputs are checked too)."""
    who = ("3 compute parties with replicated sharing: no two may work together" if trust == "replicated" else
           f"{parties} parties and a dealer: the dealer works with no party, and not every party against the others")
    if security == "malicious":
        return (f"security: malicious, with abort ({who}; any one may deviate: each proves its own input, "
                "contribution plus noise share, within its bound, and every opening is checked by both holders of "
                "each share, so a deviation stops the job before anything it affects is revealed"
                + ("; every data owner proves its contribution within its bound the same way, and one whose proof "
                   "fails is left out" if owners else "") + ")")
    return (f"security: {security} ({who}; the parties are trusted to follow the protocol, and every revealed "
            "value is agreed on by digest before anyone uses it)")


def search_summary(spec: Any, points: Any) -> dict[str, Any]:
    """The search's settings (best first) and its proposal: the best setting when it beats the
    job as written by more than the margin that makes a forecast hopeless, else none."""
    rows = [{**p.overrides(), "metric": p.forecast.metric, "mean": p.mean, "hopeless": p.forecast.hopeless,
             "noise_multiplier": p.forecast.noise_multiplier} for p in points]
    t = spec.training
    own = next((r for r in rows if (r["iterations"], r["learning_rate"], r.get("sampling_rate", 1.0))
                == (t.iterations, t.learning_rate, t.sampling_rate)), None)
    best = rows[0] if rows else None
    better = (best is not None and own is not None and not best["hopeless"] and best is not own
              and best["mean"] > own["mean"] + points[0].forecast.margin)
    return {"settings": rows, "as_written": own, "proposed": best if better else None}


def search_lines(spec: Any, summary: dict[str, Any], runs: int) -> list[str]:
    """``job plan --search``'s lines: the five best settings and the proposal."""
    rows, own = summary["settings"], summary["as_written"]
    metric = rows[0]["metric"] if rows else "accuracy"
    q_col = spec.training.sampling_rate < 1.0
    out = [f"search at the job's ε and δ over {len(rows)} settings of [training] ({runs} run{'s' if runs > 1 else ''} "
           "each, on the stand-in rows: this spends no ε only if they are public, since a choice made on private rows "
           "leaks):", ("  sampling_rate  " if q_col else "  ") + f"iterations  learning_rate  {metric:<9} z"]
    shown = rows[:5] + ([own] if own is not None and own not in rows[:5] else [])
    for r in shown:
        z = "-" if r["noise_multiplier"] is None else f"{r['noise_multiplier']:.3g}"
        q = f"{r.get('sampling_rate', 1.0):<15.4g}" if q_col else ""
        out.append(f"  {q}{r['iterations']:<12}{r['learning_rate']:<15.4g}{r['mean']:<10.4f}{z}"
                   + ("  (hopeless)" if r["hopeless"] else "") + ("  ← as written" if r is own else ""))
    best = summary["proposed"]
    if best is None:
        out.append("the job as written is the best setting found (or within the forecast's spread of it)")
    else:
        keys = ", ".join(f"{k} = {best[k]:.6g}" for k in ("sampling_rate", "iterations", "learning_rate") if k in best)
        out.append(f"proposed: [training] {keys} → {metric} {best['mean']:.4f} (as written: "
                   f"{own['mean']:.4f}); set it in the job file and plan again")
    return out


def describe(fc: Any) -> dict[str, Any]:
    band = fc.band()
    return {
        "method": fc.method, "mechanism": fc.mechanism, "rounds": fc.rounds, "dim": fc.dim,
        "sensitivity": fc.sensitivity, "noise_std_per_coordinate": fc.noise_std,
        "signal_norm": fc.signal_norm, "noise_to_signal": fc.noise_to_signal, "epsilon": fc.epsilon,
        "delta": fc.delta, "epsilon_by_accountant": fc.epsilon_by_accountant, "metric": fc.metric,
        "private_runs": fc.private, "private_mean": None if band is None else band[0],
        "private_band_10_90": None if band is None else [band[1], band[2]], "nonprivate": fc.nonprivate,
        "nonprivate_is": fc.reference, "noise_free": fc.noise_free,
        "constant_predictor": fc.trivial, "recovered": fc.recovered, "hopeless": fc.hopeless, "weak": fc.weak,
        "sampling_rate": fc.sampling_rate, "noise_multiplier": fc.noise_multiplier, "verdict": verdict(fc),
    }


#: ``--schema``, as every command that reads the parties' CSV files takes it.
SCHEMA_OPTION = click.option(
    "--schema", "schema_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
    help="the data schema the parties hold (maps each CSV's columns to features and labels)")


#: Stand-in files a network job's dry run reads without a schema, by their ``format`` (as a party's
#: data set config names it): arrays X and y, or a CSV listing PNG images and their labels.
ARRAY_FORMATS = ("npz", "png")


def array_format(paths: tuple[Path, ...], given: str | None) -> str:
    """``--format``, or the files' own: .npz/.npy are arrays; a CSV read without a schema is taken
    as a PNG listing (columns ``file`` and ``label``). What ``job plan`` and ``model predict`` read
    a network's files by."""
    if given is not None:
        return given
    kinds = {"npz" if p.suffix.lower() in (".npz", ".npy") else "png" if p.suffix.lower() == ".csv" else p.suffix
             for p in paths}
    if len(kinds) != 1 or not kinds <= set(ARRAY_FORMATS):
        raise click.BadParameter(f"without a schema the files are arrays (.npz: X and y) or a CSV listing PNG images "
                                 f"(columns file, label); got {', '.join(sorted(map(str, kinds)))}: say which with "
                                 "--format", param_hint="--data")
    return kinds.pop()


def load_array_parts(spec: Any, fmt: str, data: tuple[Path, ...], eval_path: Path | None) -> tuple[list[Any], Any]:
    """A network job's stand-in rows read as a party reads its own (``parties.rows``: the same
    loader by ``format``, pixels / 255 for images, no clipping: a network's privacy rests on
    clipping each gradient), and the evaluation file likewise."""
    from mpc_erm.data.loaders import load_file
    from mpc_erm.models.job_model import label_task

    task = label_task(spec)
    parts = [load_file(fmt, p, task=task, label="label") for p in data]
    return parts, None if eval_path is None else load_file(fmt, eval_path, task=task, label="label")


@click.command("plan")
@click.argument("job_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--schema", "schema_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="the data schema the parties hold (maps each CSV's columns to features and labels); a network "
                   "job on arrays or images needs none")
@click.option("--format", "data_format", type=click.Choice(ARRAY_FORMATS), default=None,
              help="without --schema: the stand-in files' format (default: by their suffix, .npz or a .csv listing "
                   "PNG images)")
@click.option("--data", "data", multiple=True, required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="one file per party, in the job's party order (repeat): stand-in rows with realistic counts — a "
                   "CSV read through --schema, or a network job's arrays (.npz) or PNG listing; for a job with data "
                   "owners, any number of files whose rows are dealt to its owners")
@click.option("--eval", "eval_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="a labelled file to score the simulated models on, in the format of --data (default: the pooled "
                   "--data rows)")
@click.option("--runs", default=5, show_default=True, type=click.IntRange(1, 100), help="simulated runs")
@click.option("--search", "do_search", is_flag=True,
              help="also forecast the job at its own (ε, δ) with the sampling rate ×1, ½, ¼, the rounds ×½, 1, 2 and "
                   "the learning rate ×½, 1, 2, and propose the best (spends no ε only if --data is public)")
@click.option("--search-runs", default=2, show_default=True, type=click.IntRange(1, 20),
              help="simulated runs per searched setting")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def plan(job_file: Path, schema_path: Path | None, data_format: str | None, data: tuple[Path, ...],
         eval_path: Path | None, runs: int, do_search: bool, search_runs: int, as_json: bool) -> None:
    """Dry run: JOB_FILE's noise, signal and ε, and a simulated run of the job on --data, before
    any ε is spent. Exits 3 when the job is hopeless (its simulated runs do no better than a
    constant); the verdict is kept beside the job file (JOB.plan.json), where `job submit` asks
    for --yes if it is hopeless. --search proposes a better sampling rate, rounds and learning rate."""
    from mpc_erm.data.schema import read_csv_with_schema
    from mpc_erm.jobs import load_job_file
    from mpc_erm.privacy.errors import PlanError
    from mpc_erm.simulate.forecast import REFERENCE_WORDS, forecast_job

    jf = load_job_file(job_file)
    owners = len(jf.job.owners) or None
    if owners is None and len(data) != len(jf.job.parties):
        raise ValueError(f"--data: the job has {len(jf.job.parties)} parties ({', '.join(jf.job.parties)}); "
                         f"give one CSV each, got {len(data)}")
    if schema_path is None:
        if not jf.spec.model.is_network:
            raise click.BadParameter(f"a {jf.spec.model.name} model reads tabular rows through the parties' data "
                                     "schema: give it (arrays and images without one are for network jobs)",
                                     param_hint="--schema")
        parts, evaluate = load_array_parts(jf.spec, array_format(data, data_format), data, eval_path)
    else:
        schema, parts = load_parts(schema_path, data)
        if jf.job.schema_sha256 is not None and jf.job.schema_sha256 != schema.digest():
            raise ValueError(f"--schema: {schema_path} has sha256 {schema.digest()[:12]}…, the job pins "
                             f"job.schema_sha256 = {jf.job.schema_sha256[:12]}…")
        if jf.classes_from_schema:  # a softmax's class count is the pinned schema's, as at the parties
            if schema.task != "multiclass":
                raise click.BadParameter(f"{schema_path.name} has a {schema.task} label; model.n_classes is left to "
                                         "a multiclass schema", param_hint="--schema")
            jf = jf.with_schema_classes(schema.n_classes)
        if jf.job.features is not None and parts[0].d != jf.job.features:
            raise ValueError(f"--schema: {schema_path.name} makes {parts[0].d} features per row; the job's owners "
                             f"send job.features = {jf.job.features}")
        evaluate = None if eval_path is None else read_csv_with_schema(eval_path, schema)
    try:
        fc = forecast_job(jf.spec, parts, evaluate=evaluate, runs=runs, owners=owners, noise_split=jf.noise_split())
    except PlanError as exc:  # the job against these files, naming the field: a usage error, not a crash
        raise click.BadParameter(str(exc), param_hint="--data") from None
    out = {**describe(fc), "trust": jf.job.trust, "security": jf.job.security, "noise": jf.spec.privacy.noise}
    points = None
    if do_search:
        from mpc_erm.simulate.search import search

        points = search(jf.spec, parts, evaluate=evaluate, runs=search_runs, owners=owners,
                        noise_split=jf.noise_split())
        out["search"] = search_summary(jf.spec, points)
    receipt = write_receipt(job_file, jf.spec_digest(), out, data)
    if as_json:
        click.echo(json.dumps({"job": jf.job.name, **out}, indent=2, default=float))
    else:
        total = sum(p.n for p in parts)
        sizes = (f"{total} stand-in rows dealt to {owners} owners (about {total // owners} each)" if owners else
                 ", ".join(f"{n} {p.n}" for n, p in zip(jf.job.parties, parts, strict=True)))
        kind = (f"{fc.method} perturbation" if jf.spec.transfer is None else
                "knowledge transfer (the output teacher's scores on public rows, then a student)")
        click.echo(f"job {jf.job.name}: {kind}, {fc.mechanism} noise, {fc.rounds} release(s) of "
                   f"{fc.dim} numbers; rows: {sizes}")
        click.echo(f"  {security_line(jf.job.trust, jf.job.security, len(jf.job.parties), bool(jf.job.owners))}")
        if jf.spec.training.batch_size is not None:
            click.echo(f"  batches: exactly {jf.spec.training.batch_size} of the {total} pooled rows a round, drawn by "
                       "the parties' secret shuffle; each party learns only its own rows' draws (its view is "
                       "accounted)")
        if jf.spec.privacy.noise == "distributed":
            click.echo(f"  noise: distributed ({jf.noise_split().describe()}); the figures below include it")
        click.echo(f"  noise per coordinate {fc.noise_std:.4g} (sensitivity {fc.sensitivity:.4g}); "
                   f"signal norm {fc.signal_norm:.4g}; noise/signal {fc.noise_to_signal:.3g}")
        accs = ", ".join(f"{k} {'n/a' if v is None else f'{v:.4g}'}" for k, v in fc.epsilon_by_accountant.items())
        click.echo(f"  ε = {fc.epsilon:.4g} at δ = {fc.delta:.3g} (the job's accountant); by accountant: {accs}")
        band = fc.band()
        if band is not None:
            where = str(eval_path) if eval_path else "the pooled rows"
            quiet = ("" if fc.noise_free is None or fc.reference != "exact_minimiser"
                     else f"the same rounds without noise {fc.noise_free:.4f}; ")
            click.echo(f"  simulated {fc.metric} on {where} over {runs} runs: {band[0]:.4f} "
                       f"(10–90 %: {band[1]:.4f}–{band[2]:.4f}); {quiet}{REFERENCE_WORDS[fc.reference]} "
                       f"{fc.nonprivate:.4f}; "
                       f"a constant predictor {fc.trivial:.4f}")
        click.echo(f"  {verdict(fc)}")
        if points is not None:
            for line in search_lines(jf.spec, out["search"], search_runs):
                click.echo(f"  {line}")
        if receipt is not None:
            click.echo(f"  (kept in {receipt.name}: `job submit` reads it)")
    if fc.hopeless:
        raise SystemExit(3)
