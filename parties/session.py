"""A job's session among its members: the share transport, the CrypTen session, and the agreement
that every member holds the identical job, data schema and public test set before anything is
computed (the row counts, under replace-one adjacency, are the public weights n_j/n)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from mpc_erm.data.dataset import Dataset
from mpc_erm.mpc.agreement import check_setup
from mpc_erm.mpc.callers import CallerPolicy
from mpc_erm.mpc.communicator import GrpcCommunicator, init_crypten
from mpc_erm.mpc.crypten_compat import import_crypten
from mpc_erm.mpc.dealer import start_dealer_client
from mpc_erm.mpc.rss_provider import start_replicated_provider
from mpc_erm.mpc.transport import Member, PartyTable, TransportOptions, TransportServer
from mpc_erm.runs import RunRows

from .context import WorkerContext
from .public_errors import PublicError

__all__ = ["AgreementError", "DealerJobAborted", "agree", "column_digests", "hosts", "join", "peer_timeout",
           "rows_digest", "schema_digest", "trust_setup"]


def peer_timeout(ctx: WorkerContext) -> float:
    """The daemon's ``peer_timeout_s``: every wait on a peer (a message, an endpoint look-up)."""
    return float(ctx.config.peer_timeout_s)


class AgreementError(PublicError):
    """The members do not hold the identical job or the same dataset schema: nothing was revealed.
    The message names only members, the data set id and digests (public, code AGREEMENT); a schema
    mismatch's columns are in ``detail``, which stays in this party's log."""

    def __init__(self, public: str, detail: str | None = None) -> None:
        super().__init__("AGREEMENT", public, f"{public}; {detail}" if detail else None)


class DealerJobAborted(RuntimeError):
    """The dealer's job ended without party 0's "terminate": a party went away or failed."""


# ------------------------------------------------------------------------------------ data


def schema_digest(ds: Dataset) -> str:
    return hashlib.sha256(json.dumps([list(ds.feature_names), ds.task, ds.n_classes]).encode()).hexdigest()


def rows_digest(ds: Dataset | None) -> str | None:
    """A public test set's digest (its rows, labels and column names): members that hold one must
    hold the same, so the curve every member publishes is one curve. None: no public test set."""
    if ds is None:
        return None
    h = hashlib.sha256(schema_digest(ds).encode())
    h.update(np.ascontiguousarray(ds.X, dtype=np.float64).tobytes())
    h.update(np.ascontiguousarray(ds.y, dtype=np.float64).tobytes())
    return h.hexdigest()


def _compare_public_tests(ctx: WorkerContext, everyone: list[dict[str, Any]]) -> None:
    """The public test sets are public among the members: two members holding different ones would
    publish two curves for one model, so the job is refused naming them (a member with none
    publishes no curve)."""
    held = [(e["name"], e.get("public_test")) for e in everyone if e.get("public_test")]
    if len({d for _, d in held}) > 1:
        shown = ", ".join(f"{n!r} {d[:12]}…" for n, d in held)
        raise AgreementError(f"public test set mismatch for {ctx.job.job.dataset!r}: {shown}; members that set "
                             "public_test must hold the same file (its rows, read through the schema); "
                             "nothing revealed")


def _public_rows_for_transfer(ctx: WorkerContext, everyone: list[dict[str, Any]]) -> None:
    """A knowledge-transfer job on the public test file (``transfer.public = "public_test"``) scores
    its rows at every member: each must hold one (the same, :func:`_compare_public_tests`)."""
    tr = getattr(ctx.job.spec, "transfer", None)
    if tr is None or tr.public != "public_test":
        return
    without = [e["name"] for e in everyone if not e.get("public_test")]
    if without:
        raise AgreementError(f"transfer.public: the job scores the public test file of {ctx.job.job.dataset!r}, but "
                             f"{', '.join(repr(n) for n in without)} hold{'s' if len(without) == 1 else ''} none "
                             "(public_test in the data set's config); nothing revealed")


def column_digests(ds: Dataset, salt: str) -> list[str]:
    """One short digest per (position, feature name), salted with the job digest: enough for each
    party to find *which positions* differ, without any party sending its column names."""
    return [hashlib.sha256(json.dumps([salt, k, str(name)]).encode()).hexdigest()[:16]
            for k, name in enumerate(ds.feature_names)]


def _schema_difference(ds: Dataset, mine: list[str], theirs: list[str]) -> str:
    """For this party's log only: our columns whose name or position the other party does not share."""
    names = [str(n) for n in ds.feature_names]
    differ = [names[k] for k in range(len(mine)) if k >= len(theirs) or mine[k] != theirs[k]]
    out = f"we have {len(mine)} columns, they have {len(theirs)}"
    if differ:
        shown = ", ".join(repr(n) for n in differ[:20]) + (f" and {len(differ) - 20} more" if len(differ) > 20 else "")
        out += f"; our columns that differ: {shown}"
    else:
        out += f"; every column is the same: the task or class count differs (ours: {ds.task!r}, {ds.n_classes})"
    return out


def _compare_schemas(ctx: WorkerContext, mine: dict[str, Any], everyone: list[dict[str, Any]]) -> None:
    """Every member must hold the same data schema (by digest). Schemas are public among the
    members, so the refusal names the member and the columns whose public description differs."""
    ours = mine.get("data_schema")
    for e in everyone:
        theirs = e.get("data_schema")
        if (ours or {}).get("digest") == (theirs or {}).get("digest"):
            continue
        if ours is None or theirs is None:
            has, lacks = (e["name"], ctx.identity.name) if ours is None else (ctx.identity.name, e["name"])
            raise AgreementError(f"dataset schema mismatch: party {has!r} has a schema file for "
                                 f"{ctx.job.job.dataset!r}, party {lacks!r} has none; every member needs the "
                                 "same schema; nothing revealed")
        a, b = list(ours["lines"]), list(theirs["lines"])
        differ = [f"ours {x!r} vs {y!r}" for x, y in zip(a, b, strict=False) if x != y]
        differ += [f"only ours: {x!r}" for x in a[len(b):]] + [f"only theirs: {y!r}" for y in b[len(a):]]
        raise AgreementError(f"dataset schema mismatch: party {e['name']!r} holds schema "
                             f"{theirs['digest'][:12]}… for {ctx.job.job.dataset!r}, {ctx.identity.name!r} holds "
                             f"{ours['digest'][:12]}…: " + "; ".join(differ[:4]) + "; nothing revealed")


# ------------------------------------------------------------------------------------ session


def _members(ctx: WorkerContext) -> tuple[list[str], str | None]:
    return list(ctx.job.job.parties), ctx.job.job.dealer


def hosts(ctx: WorkerContext) -> tuple[str, str]:
    """(host a worker's server binds, host its peers dial): the daemon's listen and advertise hosts."""
    return (str(ctx.config.listen).rsplit(":", 1)[0],
            str(ctx.config.advertise or ctx.config.listen).rsplit(":", 1)[0])


def join(ctx: WorkerContext, callers: CallerPolicy) -> tuple[TransportServer, GrpcCommunicator | PartyTable]:
    """Transport server (its callers checked by ``callers``) + PartyTable + CrypTen session;
    returns (server, comm)."""
    listen_host, adv_host = hosts(ctx)
    server = TransportServer.configured(ctx.identity, f"{listen_host}:0", callers=callers,
                                        max_message_bytes=ctx.config.limits.transport_max_message_bytes)
    port = server.start()
    ctx.publish_endpoint(f"{adv_host}:{port}")
    parties, dealer = _members(ctx)
    me = ctx.identity.name
    addr = {n: (f"{adv_host}:{port}" if n == me else ctx.lookup_endpoint(n, peer_timeout(ctx))) for n in parties}
    if dealer:
        addr[dealer] = f"{adv_host}:{port}" if dealer == me else ctx.lookup_endpoint(dealer, peer_timeout(ctx))
    table = PartyTable(
        job_id=ctx.job_id,
        parties=tuple(Member(n, addr[n], "party") for n in parties),
        dealer=Member(dealer, addr[dealer], "dealer") if dealer else None,
    )
    ctx.emit({"phase": "connecting", "message": f"{len(parties)} parties" + (f" + dealer {dealer}" if dealer else "")})
    if ctx.identity.role == "dealer":
        return server, table
    options = TransportOptions(deadline_s=peer_timeout(ctx), deadline_name="peer_timeout_s")  # named in a timeout
    comm = init_crypten(table, me, ctx.identity, server=server, options=options)
    return server, comm


def trust_setup(ctx: WorkerContext, comm: GrpcCommunicator) -> None:
    """dealer: every triple from the job's dealer; replicated: 3-party RSS, no dealer (the binary
    triples and B2A bits of comparisons made by the parties themselves, mpc.rss_provider); then
    the parties check that their random streams are shared (mpc.agreement.check_setup)."""
    if ctx.job.job.trust == "replicated":
        start_replicated_provider()
    else:
        import_crypten().config.cfg.mpc.protocol = "beaver"
        start_dealer_client(comm)
    check_setup(comm)  # the pairwise and joint streams are shared, or the job stops here


def agree(ctx: WorkerContext, comm: GrpcCommunicator, rows: RunRows | None) -> list[int] | None:
    """All-gather (digest, schema, public test set's digest, n) and refuse any mismatch; returns
    every party's row count (replace-one adjacency) or None (add/remove: counts stay private, n is
    not sent). ``rows``: None at a compute party for data owners (it holds none)."""
    ds, test, schema = (None, None, None) if rows is None else (rows.train, rows.test, rows.schema)
    digest = ctx.job.spec_digest()
    # under add/remove a count is a private statistic: it never leaves the party (privacy.plan)
    public_counts = ctx.job.spec.privacy.adjacency == "replace"
    mine = {"digest": digest, "schema": None if ds is None else schema_digest(ds),  # None: compute for owners
            "n": int(ds.n) if public_counts else None, "name": ctx.identity.name,
            "columns": [] if ds is None else column_digests(ds, digest), "public_test": rows_digest(test)}
    if schema is not None:  # a schema is public among the members: its lines may be compared openly
        mine["data_schema"] = {"digest": schema.digest(), "lines": schema.describe_columns()}
    everyone = [comm.broadcast_obj(mine if r == comm.get_rank() else None, r) for r in range(comm.get_world_size())]
    names = [e["name"] for e in everyone]
    for e in everyone:
        if e["digest"] != mine["digest"]:
            raise AgreementError(f"job spec mismatch: party {e['name']!r} holds a different job (digest "
                                 f"{e['digest'][:12]}… vs ours {mine['digest'][:12]}…); nothing revealed")
    _compare_schemas(ctx, mine, everyone)
    _compare_public_tests(ctx, everyone)
    _public_rows_for_transfer(ctx, everyone)
    other = [e for e in everyone if e["schema"] != mine["schema"]]
    if other:  # the public reason names the parties; which columns differ stays in this party's log
        who = ", ".join(repr(e["name"]) for e in other)
        detail = "; ".join(f"vs {e['name']!r}: " + _schema_difference(ds, mine["columns"], list(e.get("columns") or []))
                           for e in other)
        raise AgreementError(f"dataset schema mismatch: part{'ies' if len(other) > 1 else 'y'} {who} "
                             f"{'have' if len(other) > 1 else 'has'} different features for {ctx.job.job.dataset!r} "
                             f"than {ctx.identity.name!r}; nothing revealed; each party's log names its own "
                             "differing columns", detail)
    if names != list(ctx.job.job.parties):
        raise AgreementError(f"party order {names} differs from the job's {list(ctx.job.job.parties)}")
    return [int(e["n"]) for e in everyone] if public_counts else None


# ------------------------------------------------------------------------------------ protocol
