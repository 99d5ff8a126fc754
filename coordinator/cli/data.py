"""`mpc-erm data check|digest|example`: a member's data files against the consortium's public schema.

Why a command: a party must find a wrong column, a text label or an empty cell in its own file
before a job starts (the daemon checks the same at start-up and again in each job, but then the
error is in its log), and the coordinator needs the schema's digest to pin it in a job file.
Everything printed here stays on this machine: counts of this party's own rows are for its operator.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

_JSON = click.option("--json", "as_json", is_flag=True, help="machine-readable output")


@click.group()
def data() -> None:
    """Check a party's data against its schema; print a schema's digest; write example files."""


def _config(path: Path) -> Any:
    """A party or a data owner's config (an owner's has a [compute] table)."""
    from mpc_erm.jobs.toml_reader import read_toml_file
    from parties.config import load_owner_config, load_party_config

    raw = read_toml_file(path)
    return load_owner_config(path) if isinstance(raw, dict) and "compute" in raw else load_party_config(path)


def check_dataset(ds_id: str, cfg: Any) -> dict[str, Any]:
    """Read one data set as a job would and summarise it (for this party's operator only)."""
    from mpc_erm.data.schema import read_csv_with_schema, read_table

    out: dict[str, Any] = {"dataset": ds_id, "format": cfg.format}
    schema = cfg.schema() if hasattr(cfg, "schema") else None
    if schema is None:
        out["schema"] = None
        if cfg.format == "builtin":
            out["note"] = f"the built-in data set {cfg.name!r}, shard {cfg.part} of {cfg.of}"
            return out
        return {**out, **_check_file(cfg)}
    frame = read_table(cfg.path, max_bytes=cfg.max_bytes)
    ds = schema.dataset(frame, str(cfg.path), name=ds_id)
    used = {c.name for c in schema.columns} | {schema.label.column}
    out.update({
        "schema": str(cfg.feature_schema), "schema_sha256": schema.digest(), "rows": int(ds.n),
        "rows_dropped": int(len(frame) - ds.n), "features": ds.d, "task": ds.task,
        "ignored_columns": [c for c in frame.columns if c not in used],
    })
    public_test = getattr(cfg, "public_test", None)
    if public_test is not None:  # read as a job reads it (parties/rows.py)
        test = read_csv_with_schema(public_test, schema, max_bytes=cfg.max_bytes)
        out["public_test"] = {"path": str(public_test), "rows": int(test.n)}
    if ds.task != "regression":
        names = schema.label.class_names or []
        codes = (ds.y > 0).astype(int) if ds.task == "binary" else ds.y.astype(int)
        out["label_counts"] = {str(names[k]): int((codes == k).sum()) for k in range(len(names))}
    return out


def _check_file(cfg: Any) -> dict[str, Any]:
    """A data set without a schema (arrays, images, LIBSVM, a CSV with a label column), read by the
    loader a job uses: its rows, each row's shape, the label counts, and what a job does to them."""
    import numpy as np

    from mpc_erm.data.loaders import load_file

    task = "multiclass" if cfg.format in ("png", "idx", "csv") else None  # npz and libsvm state or infer theirs
    ds = load_file(cfg.format, cfg.path, task=task, label=cfg.label, max_bytes=cfg.max_bytes,  # type: ignore[arg-type]
                   feature_range=cfg.feature_range, labels=cfg.labels)
    shape = _row_shape(cfg, ds.d)
    out: dict[str, Any] = {"rows": int(ds.n), "features": int(ds.d), "row_shape": list(shape), "task": ds.task,
                           "value_range": [float(np.min(ds.X)), float(np.max(ds.X))]}
    if ds.task != "regression":
        values, counts = np.unique(np.asarray(ds.y), return_counts=True)
        out["label_counts"] = {_label(v, ds.task): int(c) for v, c in zip(values, counts, strict=True)}
    pixels = "pixels / 255, " if cfg.format in ("png", "idx") else ""
    out["preprocessing"] = (f"a network job uses each row as it is ({pixels}reshaped to its input_shape) and clips "
                            "each example's gradient; a linear job clips each row into the unit ball first")
    return out


def _row_shape(cfg: Any, d: int) -> tuple[int, ...]:
    """(C, H, W) for images, from a header (the loader has read and checked every image), else (d,)."""
    if cfg.format == "png":
        from mpc_erm.data.images import png_shape

        return png_shape(cfg.path)
    if cfg.format == "idx":
        from mpc_erm.data.images import read_idx_shape

        return (1, *read_idx_shape(cfg.path, max_bytes=cfg.max_bytes)[1:])
    return (d,)


def _label(v: Any, task: str) -> str:
    if task == "binary":
        return "positive (+1)" if float(v) > 0 else "negative (−1)"
    return str(int(v)) if float(v).is_integer() else str(v)


@data.command("check")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="the party's (or data owner's) TOML config")
@click.option("--dataset", "only", default=None, help="check only this data set id")
@_JSON
def check(config_path: Path, only: str | None, as_json: bool) -> None:
    """Read each data set through its schema exactly as a job would; print rows, features, the
    schema's sha256 (for a job's `job.schema_sha256`) and anything refused, naming the column."""
    cfg = _config(config_path)
    ids = [only] if only else list(cfg.datasets)
    if only and only not in cfg.datasets:
        raise ValueError(f"--dataset: {only!r} is not in {config_path} (it has {', '.join(cfg.datasets)})")
    results = [check_dataset(i, cfg.datasets[i]) for i in ids]
    if as_json:
        click.echo(json.dumps({"member": cfg.identity.name, "datasets": results}, indent=2))
        return
    for r in results:
        if r["schema"] is None and "note" in r:
            click.echo(f"{r['dataset']}: {r['format']}, {r['note']}")
            continue
        if r["schema"] is None:
            shape = "×".join(map(str, r["row_shape"]))
            click.echo(f"{r['dataset']}: ok — {r['rows']} rows of {shape} ({r['features']} values each, from "
                       f"{r['value_range'][0]:.4g} to {r['value_range'][1]:.4g}), {r['task']}, {r['format']} "
                       "(no schema)")
            if r.get("label_counts"):
                click.echo("  labels: " + ", ".join(f"{k} {v}" for k, v in r["label_counts"].items()))
            click.echo(f"  {r['preprocessing']}")
            continue
        click.echo(f"{r['dataset']}: ok — {r['rows']} rows ({r['rows_dropped']} dropped for missing values), "
                   f"{r['features']} features, {r['task']}")
        click.echo(f"  schema {r['schema']}")
        click.echo(f"  schema_sha256 = \"{r['schema_sha256']}\"")
        if r.get("label_counts"):
            click.echo("  labels: " + ", ".join(f"{k} {v}" for k, v in r["label_counts"].items()))
        if r.get("public_test"):
            click.echo(f"  public test set {r['public_test']['path']}: {r['public_test']['rows']} rows (its metrics "
                       "are published in every job's curve: public rows only)")
        if r["ignored_columns"]:
            click.echo("  columns not in the schema (ignored): " + ", ".join(r["ignored_columns"][:20]))


@data.command("digest")
@click.argument("schema_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def digest(schema_file: Path) -> None:
    """Print SCHEMA_FILE's sha256 (of its meaning: comments and key order do not change it)."""
    from mpc_erm.data.schema import load_schema

    click.echo(load_schema(schema_file).digest())


@data.command("example")
@click.argument("name", type=click.Choice(["adult", "breast-cancer", "diabetes", "digits"]))
@click.option("--parties", "names", default="alice,bob,carol", show_default=True,
              help="comma-separated party names: one training file each")
@click.option("--holdout", default=0.2, show_default=True,
              help="breast-cancer, diabetes: fraction of rows kept out as new.csv (adult: its own test file)")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path))
def example(name: str, names: str, holdout: float, out_dir: Path) -> None:
    """Write a public data set as the files organisations would hold: for tables, CSV files in raw
    units with text labels and an id column, one per party (<party>.csv) and held-out rows to
    predict (new.csv); for images, one folder of PNG files per party with its labels.csv (columns
    file, label), and new/ likewise.

    adult: UCI Adult (income above $50K, binary); breast-cancer: Wisconsin diagnostic (binary);
    diabetes: Efron et al.'s 442 patients, disease progression after a year (a regression);
    digits: scikit-learn's 1,797 handwritten digits, 8×8 greyscale PNG images (10 classes)."""
    import numpy as np
    import pandas as pd
    from sklearn.datasets import load_breast_cancer, load_diabetes

    parties = [n.strip() for n in names.split(",") if n.strip()]
    if not parties:
        raise ValueError("--parties: give at least one name")
    if not 0.0 < holdout < 0.9:
        raise ValueError(f"--holdout: must lie in (0, 0.9), got {holdout}")
    out_dir.mkdir(parents=True, exist_ok=True)
    if name == "digits":
        _example_images(parties, holdout, out_dir)
        return
    if name == "adult":  # UCI Adult as shipped: its own test file is the held-out one
        from mpc_erm.data.sets import ADULT_COLUMNS, BUNDLED_DATA

        def read(f: str, skip: int) -> pd.DataFrame:
            df = pd.read_csv(BUNDLED_DATA / "adult" / f, header=None, names=list(ADULT_COLUMNS), dtype=str,
                             skipinitialspace=True, skiprows=skip, keep_default_na=False)
            df["income"] = df["income"].str.strip().str.rstrip(".")
            return df.rename(columns=lambda c: c.replace("-", "_"))

        frame, new = read("adult.data.gz", 0), read("adult.test.gz", 1)
        order = np.arange(len(frame))
    else:
        if name == "breast-cancer":
            b = load_breast_cancer()
            frame = pd.DataFrame(b.data, columns=[str(c).replace(" ", "_") for c in b.feature_names])
            frame["diagnosis"] = np.where(b.target == 0, "malignant", "benign")
        else:  # sklearn's copy in raw units (scaled=False); its serum columns s1..s6 named as in its notes
            b = load_diabetes(scaled=False)
            frame = pd.DataFrame(b.data, columns=["age", "sex", "bmi", "bp", "tc", "ldl", "hdl", "tch", "ltg", "glu"])
            frame["sex"] = frame["sex"].map({1.0: "1", 2.0: "2"})  # coded 1/2 in the source, no names given
            frame["progression"] = b.target
        shuffled = np.random.default_rng(2026).permutation(len(frame))
        k = round(holdout * len(frame))
        new, order = frame.iloc[shuffled[:k]], shuffled[k:]
    frame.insert(0, "record_id", [f"R{i:06d}" for i in range(len(frame))])  # a column no schema uses
    new.to_csv(out_dir / "new.csv", index=False)
    for i, chunk in enumerate(np.array_split(order, len(parties))):
        frame.iloc[np.sort(chunk)].to_csv(out_dir / f"{parties[i]}.csv", index=False)
    click.echo(f"wrote {', '.join(f'{p}.csv' for p in parties)} ({len(order)} rows in all) and new.csv "
               f"({len(new)} rows) to {out_dir}")


def _example_images(parties: list[str], holdout: float, out_dir: Path) -> None:
    """scikit-learn's 8×8 digits as PNG folders: <party>/ and new/, each with labels.csv."""
    import numpy as np
    import pandas as pd
    from PIL import Image
    from sklearn.datasets import load_digits

    b = load_digits()
    pixels = np.round(b.images * (255.0 / 16.0)).astype(np.uint8)  # the source's 0..16 grey levels
    shuffled = np.random.default_rng(2026).permutation(len(pixels))
    k = round(holdout * len(pixels))
    groups = [("new", shuffled[:k])] + list(zip(parties, np.array_split(shuffled[k:], len(parties)), strict=True))
    for folder, rows in groups:
        d = out_dir / folder
        d.mkdir(parents=True, exist_ok=True)
        files = []
        for i in np.sort(rows):
            f = f"digit_{i:05d}.png"
            Image.fromarray(pixels[i]).save(d / f)  # 2-D uint8: greyscale
            files.append(f)
        pd.DataFrame({"file": files, "label": b.target[np.sort(rows)]}).to_csv(d / "labels.csv", index=False)
    click.echo(f"wrote {', '.join(f'{p}/' for p in parties)} ({len(pixels) - k} images in all) and new/ ({k} images) "
               f"to {out_dir}, each folder with its labels.csv (columns file, label)")
