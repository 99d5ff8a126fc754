"""`mpc-erm model predict|digest`: use a released model on new rows; the digest a job pins for a
party's own network (model plugin)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from coordinator.cli.job_plan import ARRAY_FORMATS, array_format


@click.group()
def model() -> None:
    """Predict with a released model; networks a party builds with its own installed code."""


@model.command("predict")
@click.option("--model", "model_dir", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="the model directory `mpc-erm job result --out` wrote (model.json + model.safetensors)")
@click.option("--data", "data_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="a CSV file with the schema's columns (by name; other columns are ignored); for a network trained "
                   "on arrays or images: an .npz (X, and y if known) or a CSV listing PNG images (file, label)")
@click.option("--format", "data_format", type=click.Choice(ARRAY_FORMATS), default=None,
              help="a network bundle without a schema: the format of --data (default: by its suffix)")
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the predictions here as CSV (default: print them)")
@click.option("--json", "as_json", is_flag=True, help="print a summary as JSON")
def predict(model_dir: Path, data_path: Path, data_format: str | None, out_path: Path | None, as_json: bool) -> None:
    """Apply the model to DATA's rows through the schema it was trained with — or, for a network
    trained on arrays or images, to DATA's arrays or PNG images as the parties read theirs. With
    the labels in DATA, also print the accuracy (classifiers) or RMSE and R² (regression)."""
    import numpy as np
    import pandas as pd

    from mpc_erm import load_model
    from mpc_erm.data.schema import read_table

    m = load_model(model_dir)
    schema = m.meta.get("schema")
    if schema is None:
        _predict_arrays(m, model_dir, data_path, data_format, out_path, as_json)
        return
    frame = read_table(data_path)
    pred = m.predict(frame)
    table = pd.DataFrame({"prediction": pred})
    if m.meta.get("task") in ("binary", "multiclass") and m.meta["architecture"].get("loss") != "huber_svm":
        proba = np.asarray(m.predict_proba(frame), dtype=float)
        table["probability"] = proba.max(axis=1).round(6)
    has = pd.notna(table["prediction"]).to_numpy()
    summary: dict[str, object] = {"model": str(model_dir), "rows": len(frame), "predicted": int(has.sum()),
                                  "task": m.meta.get("task"), "epsilon": (m.meta.get("privacy") or {}).get("epsilon")}
    label = schema["label"]["column"]
    if label in frame.columns and has.any():
        truth = frame[label].astype(str).str.strip().to_numpy()[has]
        if m.meta.get("task") == "regression":
            y = pd.to_numeric(pd.Series(truth), errors="coerce").to_numpy(dtype=float)
            err = np.asarray(pred, dtype=float)[has] - y
            summary["rmse"] = float(np.sqrt(np.nanmean(err**2)))
            summary["r2"] = float(1.0 - np.nansum(err**2) / np.nansum((y - np.nanmean(y)) ** 2))
        else:
            summary["accuracy"] = float(np.mean(np.asarray(pred, dtype=object)[has].astype(str) == truth))
    if _emit(table, summary, out_path, as_json):
        return
    skipped = len(frame) - int(has.sum())
    if skipped:
        click.echo(f"{skipped} rows have an empty cell in a column the schema drops rows for (missing = \"drop\"): "
                   "no prediction for them")
    if "accuracy" in summary:
        click.echo(f"accuracy on the {int(has.sum())} labelled rows of {data_path.name}: {summary['accuracy']:.4f}")
    if "rmse" in summary:
        click.echo(f"on the {int(has.sum())} labelled rows of {data_path.name}: RMSE {summary['rmse']:.6g}, "
                   f"R² {summary['r2']:.4f}")


def _predict_arrays(m: object, model_dir: Path, data_path: Path, data_format: str | None, out_path: Path | None,
                    as_json: bool) -> None:
    """``predict`` for a bundle without a schema: a network trained on arrays or images. Labels in
    the file are class indices (multiclass), ±1 or 0/1 (binary), or the bundle's class names."""
    import numpy as np
    import pandas as pd

    from mpc_erm.data.loaders import load_inputs

    meta = getattr(m, "meta", {})
    if meta.get("architecture", {}).get("input_shape") is None:
        raise ValueError(f"--model: {model_dir} has no data schema (a linear model trained on unscaled files): load "
                         "it in Python with mpc_erm.load_model and pass the scaled feature matrix")
    X, raw = load_inputs(array_format((data_path,), data_format), data_path)
    proba = np.asarray(m.predict_proba(X), dtype=float)  # type: ignore[attr-defined]
    classes = list(meta["classes"])
    pred = np.asarray(classes, dtype=object)[proba.argmax(axis=1)]
    table = pd.DataFrame({"prediction": pred, "probability": proba.max(axis=1).round(6)})
    summary: dict[str, object] = {"model": str(model_dir), "rows": len(table), "predicted": len(table),
                                  "task": meta.get("task"), "epsilon": (meta.get("privacy") or {}).get("epsilon")}
    if raw is not None:
        truth = _label_indices(raw, classes)
        summary["accuracy"] = float(np.mean(proba.argmax(axis=1) == truth))
    if _emit(table, summary, out_path, as_json):
        return
    if "accuracy" in summary:
        click.echo(f"accuracy on the {len(table)} labelled rows of {data_path}: {summary['accuracy']:.4f}")


def _emit(table: Any, summary: dict[str, object], out_path: Path | None, as_json: bool) -> bool:
    """The predictions to ``out_path`` (else printed) and, with ``as_json``, the summary alone as
    JSON (then True: nothing more to print)."""
    if out_path is not None:
        table.to_csv(out_path, index=False)
        summary["out"] = str(out_path)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return True
    if out_path is None:
        click.echo(table.to_csv(index=False), nl=False)
    else:
        click.echo(f"{len(table)} predictions written to {out_path}")
    return False


def _label_indices(raw: object, classes: list[object]) -> object:
    """Each label's class index: the class names' own spelling, else ±1 / 0-1 (binary) or the
    index itself (multiclass) — what the parties' files hold. A label of neither kind is refused."""
    import numpy as np

    values = np.asarray(raw).reshape(-1)
    names = {str(c): i for i, c in enumerate(classes)}
    if all(str(v).strip() in names for v in values):
        return np.array([names[str(v).strip()] for v in values])
    try:
        num = values.astype(float)
    except (TypeError, ValueError):
        raise ValueError(f"--data: labels must be the model's classes {classes[:10]} or their indices") from None
    idx = np.where(num > 0, 1, 0) if len(classes) == 2 and set(np.unique(num)) <= {-1.0, 0.0, 1.0} else num
    if not np.all((idx == np.round(idx)) & (idx >= 0) & (idx < len(classes))):
        raise ValueError(f"--data: labels must be the model's classes {classes[:10]} or their indices "
                         f"0..{len(classes) - 1}")
    return idx.astype(np.int64)


@model.command("digest")
@click.argument("entry_point")
def digest_cmd(entry_point: str) -> None:
    """Print the sha256 of ENTRY_POINT's module source ("package.module:function"), to put in a
    job file's model.plugin_digest. The module is read, not imported (its parent packages are, to find it)."""
    from mpc_erm.models.plugins import PluginError, source_digest

    try:
        click.echo(source_digest(entry_point))
    except PluginError as exc:
        raise click.UsageError(f"ENTRY_POINT: {exc}") from None
