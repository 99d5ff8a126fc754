"""A member's own rows for one job, read where they live and never sent anywhere: what a party
daemon's job worker and a data owner's process (``parties.owner.process``) both load, the same way, so a
model trained at a party and at an owner sees the same rows.

``ctx`` is anything with ``config`` (its ``datasets`` and ``device``), ``job`` (a
:class:`~mpc_erm.jobs.jobfile.JobFile`), ``identity`` and ``job_id``: a worker's context, or an
owner's view of its config and job.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpc_erm.runs import RunRows

from .context import JobCancelled
from .public_errors import PublicError, data_failure

__all__ = ["VALIDATION_SEED", "Rows", "device_for", "load_rows", "split_validation"]


#: This party's rows for one job (train, public test, held-out validation, schema): the run layer's type.
Rows = RunRows


def load_rows(ctx: Any) -> Rows:
    """This party's training rows, a public test set if the dataset has one, and its held-out
    validation rows if its data set config asks for some, as mpc_erm Datasets.

    Any failure to read them becomes a :class:`PublicError` (DATA_SCHEMA or DATA_FILE) naming only
    the data set and this party: the loader's message (the file's path, the column, the row and
    its value) is the error's detail, for this party's log only."""
    try:
        train, test, schema = _read_rows(ctx)
        cfg = ctx.config.datasets[ctx.job.job.dataset]
        train, val = split_validation(train, getattr(cfg, "validation_fraction", 0.0))
        return Rows(train, test, val, schema)
    except (PublicError, JobCancelled):
        raise
    except Exception as exc:
        if isinstance(exc, ValueError) and str(exc).startswith("job.dataset: "):
            raise  # the job file's field, public as it is (the daemon checks it at submission)
        raise data_failure(exc, ctx.job.job.dataset, ctx.identity.name) from exc


def _read_rows(ctx: Any) -> tuple[Any, Any | None, Any | None]:
    from mpc_erm.data import Dataset, clip_to_unit_ball, load_dataset
    from mpc_erm.data.loaders import load_file
    from mpc_erm.data.partition import partition_equal
    from mpc_erm.models.job_model import label_task

    ds_id = ctx.job.job.dataset
    cfg = ctx.config.datasets.get(ds_id) if hasattr(ctx.config, "datasets") else None
    if cfg is None:
        raise ValueError(f"job.dataset: this party has no dataset {ds_id!r}")
    m = ctx.job.spec.model
    task = label_task(ctx.job.spec)
    if task != "regression":  # a data set may state its own task; ridge reads a regression label whatever it says
        task = getattr(cfg, "task", None) or task
    if cfg.format == "builtin":
        train, test = load_dataset(cfg.name)
        parts = partition_equal(train.n, cfg.of, rng=0)  # public seed: the shards are disjoint
        idx = np.sort(parts[cfg.part])
        mine = Dataset(train.X[idx], train.y[idx], train.task, f"{cfg.name}[{cfg.part}/{cfg.of}]",
                       train.feature_names, train.n_classes)
        return mine, test, None
    schema = cfg.schema() if hasattr(cfg, "schema") else None
    if schema is not None:  # the public schema maps the raw columns; rows end in the unit ball
        _check_schema(ctx, schema, task)
        from mpc_erm.data.schema import read_csv_with_schema

        test = None if cfg.public_test is None else read_csv_with_schema(cfg.public_test, schema,
                                                                         max_bytes=cfg.max_bytes)
        return read_csv_with_schema(cfg.path, schema, max_bytes=cfg.max_bytes), test, schema
    # the loader refuses a file over max_bytes before reading it, and values outside feature_range
    ds = load_file(cfg.format, cfg.path, task=task, label=cfg.label, max_bytes=cfg.max_bytes,
                   feature_range=cfg.feature_range, labels=getattr(cfg, "labels", None))
    if m.is_network or ctx.job.spec.federated is not None:
        return ds, None, None  # their privacy rests on clipping each gradient or update, not the rows
    # A user's file is expected to be scaled by a public schema; rows are clipped into the unit ball
    # so the protocols' sensitivity bounds hold whatever the file contains.
    X = clip_to_unit_ball(np.asarray(ds.X))
    return Dataset(X, ds.y, ds.task, ds.name, ds.feature_names, ds.n_classes), None, None


def _check_schema(ctx: Any, schema: Any, task: str) -> None:
    """The job may pin the schema's digest, and its model must fit the schema's label: a wrong
    pairing is refused here, before this party joins anyone (both are public facts)."""
    want = getattr(ctx.job.job, "schema_sha256", None)
    if want is not None and schema.digest() != want:
        raise PublicError("DATA_SCHEMA", f"job.schema_sha256: party {ctx.identity.name!r} holds schema "
                                         f"{schema.digest()[:12]}… for {ctx.job.job.dataset!r}, the job pins "
                                         f"{want[:12]}…; nothing revealed")
    m = ctx.job.spec.model
    fits = schema.task == task or (m.is_network and schema.task in ("binary", "multiclass"))
    if not fits:
        raise PublicError("DATA_SCHEMA", f"model.name: {m.name!r} trains a {task} model, but the schema of "
                                         f"{ctx.job.job.dataset!r} at {ctx.identity.name!r} has a "
                                         f"{schema.task} label; nothing revealed")
    if m.is_network and schema.task == "multiclass" and (m.n_classes or 2) != schema.n_classes:
        raise PublicError("DATA_SCHEMA", f"model.n_classes: {m.n_classes} outputs, the schema of "
                                         f"{ctx.job.job.dataset!r} lists {schema.n_classes} classes")


#: The validation split's permutation: fixed, so every job on a data set holds out the same rows
#: (a model picked on them was never trained on them, whichever job trained it).
VALIDATION_SEED = 0x5EED_F00D


def split_validation(ds: Any, fraction: float) -> tuple[Any, Any | None]:
    """(training rows, held-out validation rows): ``round(fraction·n)`` rows (at least one when
    ``fraction`` > 0) that no gradient of any job touches. They never leave the party: metrics on
    them are a function of its private data (no ε covers them) and go to ``.private/`` only."""
    from mpc_erm.data import Dataset

    if fraction <= 0.0:
        return ds, None
    n = int(ds.n)
    k = max(1, round(fraction * n))
    if n - k < 1:
        raise ValueError(f"validation_fraction: {fraction:g} of {n} rows leaves none to train on")
    perm = np.random.default_rng(VALIDATION_SEED).permutation(n)
    tr, va = np.sort(perm[k:]), np.sort(perm[:k])

    def part(idx: Any, tag: str) -> Any:
        return Dataset(np.asarray(ds.X)[idx], np.asarray(ds.y)[idx], ds.task, f"{ds.name}[{tag}]", ds.feature_names,
                       ds.n_classes)

    return part(tr, "train"), part(va, "validation")


def device_for(ctx: Any) -> Any:
    import torch

    want = ctx.job.job.device or ctx.config.device
    if want == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' requested but no CUDA device is available to this party")
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(want)


