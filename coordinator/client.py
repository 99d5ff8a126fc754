"""The coordinator's client of the party (and dealer) daemons: submit, status, watch, cancel,
list, result — over gRPC with mutual TLS, each channel pinned to the member's identity.

A job goes to every member with the same TOML and the same id (chosen here, uuid4 hex). Each
member *prepares* it (checks, reserves budget) and answers; the members then agree among
themselves whether it starts (:mod:`parties.agreement`): a job one member refuses ends at the
others by itself, with a reason naming that member, and :class:`SubmitRefused` names every
refusal and each member's answer. Only where a member gave no answer at all (unreachable), or
answered with another spec digest than this client's, does the client cancel the job at the
members that prepared it (they would otherwise wait up to their ``peer_timeout_s``). The members'
replies carry the spec digest each computed; they must all be equal.

Import cost: this module does not import torch; :meth:`CoordinatorClient.submit` parses the job
file (``mpc_erm.jobs.jobfile``, which does) when called.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

import grpc

from mpc_erm.jobs.status import TERMINAL, refusal_of
from mpc_erm.mpc import pki, tls
from mpc_erm.mpc.party_api import party_pb2 as pb
from mpc_erm.mpc.party_api import party_pb2_grpc as pb_grpc
from parties.job_store import content_digest

from .config import CoordinatorConfig

__all__ = ["ClientError", "CoordinatorClient", "SubmitRefused", "info_dict", "load_coordinator_identity",
           "overall_status", "refusal"]

MAX_MESSAGE_BYTES = 64 << 20
_ORDER = {"refused": 0, "failed": 1, "cancelled": 2, "running": 3, "queued": 4, "prepared": 5, "succeeded": 6}
_NO_ANSWER = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
_TERMINAL = frozenset(str(s) for s in TERMINAL)


class ClientError(ValueError):
    """A request that did not succeed; ``str()`` is one line naming the member(s) and the reason.
    ``code`` is the gRPC status when a daemon answered with one."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class SubmitRefused(ClientError):
    """``refusals``: member -> its reason; ``answers``: every member's answer ("prepared", or
    "refused: <reason>"), in the job's member order."""

    def __init__(self, job_id: str, refusals: dict[str, str], answers: dict[str, str] | None = None) -> None:
        self.job_id, self.refusals = job_id, refusals
        self.answers = answers if answers is not None else {m: f"refused: {r}" for m, r in refusals.items()}
        super().__init__(f"job refused by {', '.join(refusals)}: "
                         + "; ".join(f"{m}: {r}" for m, r in refusals.items()))


def load_coordinator_identity(cfg: CoordinatorConfig) -> pki.Identity:
    try:
        return cfg.identity.load("coordinator")  # type: ignore[no-any-return]
    except ValueError as exc:
        raise ClientError(str(exc)) from None


def info_dict(info: pb.JobInfo) -> dict[str, Any]:
    """A JobInfo as plain JSON-able data."""
    return {
        "job_id": info.job_id, "name": info.name, "member": info.member, "status": info.status,
        "reason": info.reason or None, "spec_digest": info.spec_digest, "dataset": info.dataset,
        "method": info.method, "parties": list(info.parties), "dealer": info.dealer or None,
        "coordinator": info.coordinator, "created_at": info.created_at or None,
        "started_at": info.started_at or None, "ended_at": info.ended_at or None,
        "summary": json.loads(info.summary_json) if info.summary_json else None,
        "last_phase": info.last_phase or None,
        "progress": json.loads(info.progress_json) if info.progress_json else None,
        "cancel_requested": info.cancel_requested,
    }


def overall_status(statuses: list[str]) -> str:
    """One status for a job from its members': succeeded only if all did; else the worst (a
    refusal first: it is why the others ended)."""
    if not statuses:
        return "unknown"
    return min(statuses, key=lambda s: _ORDER.get(s, -1))


def refusal(members: dict[str, dict[str, Any]]) -> dict[str, str] | None:
    """``{"member", "code", "reason"}`` of the refusal the members' reasons relay (the refusing
    member itself holds no record of the job), or None if no member was refused."""
    for v in members.values():
        r = refusal_of(v.get("reason")) if v.get("status") == "refused" else None
        if r is not None:
            return {"member": r.member, "code": r.code, "reason": r.reason}
    return None


def _rpc_error(member: str, address: str, exc: grpc.RpcError) -> str:
    code = exc.code()  # type: ignore[attr-defined]
    details = " ".join(str(exc.details() or "").split())  # type: ignore[attr-defined]
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"{member} at {address} is unreachable ({details})"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{member} at {address} did not answer in time"
    return details or code.name


def _safe_name(name: str, member: str) -> PurePosixPath:
    p = PurePosixPath(name)
    if not name or p.is_absolute() or any(part in ("", ".", "..") for part in p.parts) or "\\" in name:
        raise ClientError(f"{member}: result: refused unsafe file name {name!r}")
    return p


class CoordinatorClient:
    def __init__(self, config: CoordinatorConfig, *, identity: pki.Identity | None = None) -> None:
        self.config = config
        self.identity = identity or load_coordinator_identity(config)
        self.timeout_s = config.timeout_s
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            for ch in self._channels.values():
                ch.close()
            self._channels.clear()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- plumbing

    def members(self) -> dict[str, tuple[str, str]]:
        return self.config.members()

    def _stub(self, member: str) -> pb_grpc.PartyControlStub:
        role, address = self._member(member)
        with self._lock:
            ch = self._channels.get(member)
            if ch is None:
                opts = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
                ch = tls.secure_channel(address, self.identity, member, opts, expected_role=role)  # type: ignore[arg-type]
                self._channels[member] = ch
        return pb_grpc.PartyControlStub(ch)

    def _member(self, member: str) -> tuple[str, str]:
        try:
            return self.members()[member]
        except KeyError:
            raise ClientError(f"{member!r} is not in the coordinator config's parties or dealers") from None

    def _call(self, member: str, method: str, request: Any, timeout: float | None = None) -> Any:
        try:
            return getattr(self._stub(member), method)(request, timeout=timeout or self.timeout_s)
        except grpc.RpcError as exc:
            raise ClientError(f"{member}: {_rpc_error(member, self._member(member)[1], exc)}",
                              exc.code()) from None  # type: ignore[attr-defined]

    def _each(self, names: list[str], fn: Any) -> dict[str, Any]:
        """fn(name) for each member concurrently; name -> result or the ClientError."""
        if not names:
            return {}
        with ThreadPoolExecutor(max_workers=min(16, len(names))) as pool:
            futures = {n: pool.submit(fn, n) for n in names}
        out: dict[str, Any] = {}
        for n, f in futures.items():
            try:
                out[n] = f.result()
            except ClientError as exc:
                out[n] = exc
        return out

    # ---- health

    def health(self) -> dict[str, dict[str, Any]]:
        def one(m: str) -> dict[str, Any]:
            r = self._call(m, "Health", pb.HealthRequest())
            return {"name": r.name, "role": r.role, "version": r.version, "uptime_s": r.uptime_s,
                    "queued": r.queued, "running": r.running}

        return {m: (r if isinstance(r, dict) else {"error": str(r)}) for m, r in self._each(list(self.members()),
                                                                                           one).items()}

    # ---- submit

    def submit(self, job_file: str | os.PathLike[str], *, job_id: str | None = None) -> dict[str, Any]:
        """Submit the job file to every member; returns {job_id, name, spec_digest, members}."""
        from mpc_erm.jobs.jobfile import JobFileError, load_job_file

        known = set(self.config.parties) | set(self.config.dealers)
        try:
            job = load_job_file(job_file, known_parties=known)
        except JobFileError as exc:
            raise ClientError("; ".join(exc.problems)) from None
        source = os.fspath(job_file)
        bad = [p for p in job.job.parties if p not in self.config.parties]
        if bad:
            raise ClientError(f"{source}: job.parties: {', '.join(bad)} listed under dealers in the coordinator config")
        if job.job.dealer is not None and job.job.dealer not in self.config.dealers:
            raise ClientError(f"{source}: job.dealer: {job.job.dealer!r} is not under dealers in the "
                              "coordinator config")
        text = Path(job_file).read_text(encoding="utf-8")
        job_id = job_id or uuid.uuid4().hex
        digest = job.spec_digest()
        names = list(job.job.parties) + ([job.job.dealer] if job.job.dealer else [])
        request = pb.SubmitRequest(job_id=job_id, job_toml=text)
        replies = self._each(names, lambda m: self._call(m, "SubmitJob", request, timeout=2 * self.timeout_s))
        refusals: dict[str, str] = {}
        answers: dict[str, str] = {}
        cancel_why = []  # what the members cannot see for themselves
        for m in names:
            r = replies[m]
            if isinstance(r, ClientError):
                refusals[m] = str(r).removeprefix(f"{m}: ")
                if r.code in _NO_ANSWER:
                    cancel_why.append(f"{m} gave no answer")
            elif not r.accepted:
                refusals[m] = r.reason or "not accepted"
            elif r.spec_digest != digest:
                refusals[m] = f"computed spec digest {r.spec_digest[:12]}…, not {digest[:12]}… (different versions?)"
                cancel_why.append(f"{m} computed another spec digest")
            answers[m] = f"refused: {refusals[m]}" if m in refusals else (r.status or "prepared")
        if refusals:
            prepared = [m for m in names if m not in refusals]
            if cancel_why:  # a refusal the members hear from each other ends the job there by itself
                self._each(prepared, lambda m: self._call(
                    m, "Cancel", pb.CancelRequest(job_id=job_id, reason="; ".join(cancel_why))))
            raise SubmitRefused(job_id, refusals, answers)
        return {"job_id": job_id, "name": job.job.name, "spec_digest": digest,
                "members": {m: {"status": r.status, "note": r.reason or None} for m, r in replies.items()}}

    # ---- queries

    def status(self, job_id: str) -> dict[str, dict[str, Any]]:
        """member -> status of the job there, for every configured member that knows it."""
        got = self._each(list(self.members()), lambda m: self._call(m, "GetStatus", pb.JobRef(job_id=job_id)))
        out: dict[str, dict[str, Any]] = {}
        errors = []
        for m, r in got.items():
            if isinstance(r, ClientError):
                if r.code != grpc.StatusCode.NOT_FOUND:
                    errors.append(str(r))
                continue
            out[m] = info_dict(r)
        if not out:
            raise ClientError(f"job {job_id}: not found at any member" + (f" ({'; '.join(errors)})" if errors else ""))
        for e in errors:
            out[e.split(":", 1)[0]] = {"status": "unreachable", "reason": e}
        return out

    def job_members(self, job_id: str) -> list[str]:
        """The job's members (parties in order, then the dealer) that this config can reach."""
        st = self.status(job_id)
        info = next(v for v in st.values() if v.get("parties"))
        names = list(info["parties"]) + ([info["dealer"]] if info.get("dealer") else [])
        return [n for n in names if n in self.members()]

    def watch(self, job_id: str, *, members: list[str] | None = None, follow: bool = True,
              after_seq: int = 0) -> Iterator[dict[str, Any]]:
        """The job's events from its members as one stream (each event names its member); ends
        when every member's stream has ended (its job reached a terminal status)."""
        names = members or self.job_members(job_id)
        q: queue.Queue[tuple[str, Any]] = queue.Queue()
        calls: list[Any] = []

        def pump(m: str) -> None:
            try:
                call = self._stub(m).Watch(pb.WatchRequest(job_id=job_id, after_seq=after_seq, follow=follow))
                calls.append(call)
                for ev in call:
                    q.put(("event", {"member": m, "job_id": ev.job_id, "seq": ev.seq, "time": ev.time,
                                     "phase": ev.phase, "payload": json.loads(ev.payload_json or "{}")}))
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.CANCELLED:  # type: ignore[attr-defined]
                    q.put(("error", {"member": m, "error": _rpc_error(m, self._member(m)[1], exc)}))
            finally:
                q.put(("end", m))

        threads = [threading.Thread(target=pump, args=(m,), daemon=True, name=f"watch-{m}") for m in names]
        for t in threads:
            t.start()
        open_streams = len(threads)
        try:
            while open_streams:
                kind, item = q.get()
                if kind == "end":
                    open_streams -= 1
                elif kind == "error":
                    yield {"member": item["member"], "job_id": job_id, "phase": "error",
                           "payload": {"message": item["error"]}}
                else:
                    yield item
        finally:
            for call in calls:
                call.cancel()

    def cancel(self, job_id: str, reason: str = "", *, wait_s: float = 0.0,
               poll_s: float = 0.25) -> dict[str, dict[str, Any]]:
        """Cancel the job at every member; member -> its state.

        Why wait: a running job's worker gets its daemon's cancel grace to stop, so a member's
        Cancel reply still says ``running``. With ``wait_s`` > 0 the members' status is polled until
        each has ended the job (a terminal status) or ``wait_s`` has passed; a member still not
        ended then keeps its last state with ``"ending": True``."""
        names = self.job_members(job_id)
        got = self._each(names, lambda m: self._call(m, "Cancel", pb.CancelRequest(job_id=job_id, reason=reason)))
        out = {m: ({"status": "unreachable", "reason": str(r)} if isinstance(r, ClientError)
                   else {"status": r.status, "reason": r.reason or None}) for m, r in got.items()}
        deadline = time.monotonic() + wait_s
        waiting = [m for m, v in out.items() if v["status"] not in _TERMINAL and v["status"] != "unreachable"]
        while waiting and time.monotonic() < deadline:
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
            polled = self._each(waiting, lambda m: self._call(m, "GetStatus", pb.JobRef(job_id=job_id)))
            for m, r in polled.items():
                if not isinstance(r, ClientError):
                    out[m] = {"status": r.status, "reason": r.reason or None}
            waiting = [m for m in waiting if out[m]["status"] not in _TERMINAL]
        for m in waiting:
            out[m]["ending"] = True
        return out

    def list(self, limit: int = 0) -> list[dict[str, Any]]:
        """Jobs known to any configured member, newest first, with each member's status."""
        got = self._each(list(self.members()), lambda m: self._call(m, "ListJobs", pb.ListRequest(limit=limit)))
        jobs: dict[str, dict[str, Any]] = {}
        for m, r in got.items():
            if isinstance(r, ClientError):
                continue
            for info in r.jobs:
                j = jobs.setdefault(info.job_id, {"job_id": info.job_id, "name": info.name, "method": info.method,
                                                  "dataset": info.dataset, "created_at": info.created_at,
                                                  "members": {}, "reasons": {}})
                j["members"][m] = info.status
                j["reasons"][m] = info.reason or None
                j["created_at"] = min(j["created_at"], info.created_at)
        out = sorted(jobs.values(), key=lambda j: (-j["created_at"], j["job_id"]))
        for j in out:
            j["status"] = overall_status(list(j["members"].values()))
            j["refused_by"] = refusal({m: {"status": st, "reason": j["reasons"][m]} for m, st in j["members"].items()})
        unreachable = {m: str(r) for m, r in got.items() if isinstance(r, ClientError)}
        if unreachable and len(unreachable) == len(got):
            raise ClientError("no member answered: " + "; ".join(unreachable.values()))
        return out[:limit] if limit else out

    def resolve(self, job_ref: str) -> str:
        """A job id as given, or the id of the newest job named ``job_ref`` (the job file's
        ``job.name``), so a user can fetch ``income-model`` without copying its id."""
        jobs = self.list()
        if any(j["job_id"] == job_ref for j in jobs):
            return job_ref
        named = [j for j in jobs if j["name"] == job_ref]  # newest first
        if not named:
            raise ClientError(f"JOB: no job has the id or the name {job_ref!r} (mpc-erm job list shows them)")
        return str(named[0]["job_id"])

    # ---- results

    def manifest(self, job_id: str, member: str) -> list[dict[str, Any]]:
        try:
            chunks = list(self._stub(member).GetResult(pb.ResultRequest(job_id=job_id, manifest_only=True),
                                                       timeout=self.timeout_s))
        except grpc.RpcError as exc:
            raise ClientError(f"{member}: {_rpc_error(member, self._member(member)[1], exc)}") from None
        return [{"name": c.name, "size": c.size, "sha256": c.sha256, "content_sha256": c.content_sha256 or None}
                for c in chunks]

    def result(self, job_id: str, out_dir: str | os.PathLike[str]) -> dict[str, Any]:
        """Download the result files from the first party that holds them (checking sizes and
        sha256), and compare the model file's sha256 across all parties."""
        st = self.status(job_id)
        info = next(v for v in st.values() if v.get("parties"))
        parties = [p for p in info["parties"] if p in self.config.parties]
        ready = [p for p in parties if st.get(p, {}).get("status") == "succeeded"]
        if not ready:
            raise ClientError(f"job {job_id} has no result: "
                              + "; ".join(f"{m}: {v['status']}" + (f" ({v['reason']})" if v.get("reason") else "")
                                          for m, v in st.items()))
        source = ready[0]
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = self._download(job_id, source, out)

        def digest(f: dict[str, Any]) -> str:  # a model's content digest where it has one
            return f.get("content_sha256") or f["sha256"]

        models = {f["name"]: digest(f) for f in files if PurePosixPath(f["name"]).name.startswith("model")}
        compare: dict[str, Any] = {source: models}
        for p in parties:
            if p == source:
                continue
            try:
                man = self.manifest(job_id, p)
                compare[p] = {f["name"]: digest(f) for f in man if f["name"] in models}
            except ClientError as exc:
                compare[p] = {"error": str(exc)}
        identical = all(v == models for v in compare.values())
        return {"job_id": job_id, "out_dir": str(out), "source": source, "files": files,
                "model_sha256": compare, "models_identical": identical}

    def _download(self, job_id: str, member: str, out: Path) -> list[dict[str, Any]]:
        files: list[dict[str, Any]] = []
        current: tuple[str, Any, Any, Path] | None = None  # name, handle, hasher, temp path
        try:
            call = self._stub(member).GetResult(pb.ResultRequest(job_id=job_id), timeout=max(self.timeout_s, 600))
            for c in call:
                if current is None or current[0] != c.name:
                    if current is not None:
                        raise ClientError(f"{member}: file {current[0]!r} ended without its checksum")
                    rel = _safe_name(c.name, member)
                    dest = out.joinpath(*rel.parts)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    tmp = dest.with_name(f".{dest.name}.part")
                    current = (c.name, tmp.open("wb"), hashlib.sha256(), tmp)
                name, fh, h, tmp = current
                if c.offset != fh.tell():
                    raise ClientError(f"{member}: file {name!r}: chunk at offset {c.offset}, expected {fh.tell()}")
                fh.write(c.data)
                h.update(c.data)
                if c.last:
                    fh.close()
                    size = tmp.stat().st_size
                    if size != c.size or h.hexdigest() != c.sha256:
                        tmp.unlink(missing_ok=True)
                        raise ClientError(f"{member}: file {name!r} failed its check (size {size} vs {c.size}, "
                                          "or sha256 mismatch)")
                    final = tmp.with_name(tmp.name[1:].removesuffix(".part"))
                    os.replace(tmp, final)
                    files.append({"name": name, "size": size, "sha256": c.sha256,
                                  "content_sha256": content_digest(final) or None})
                    current = None
        except grpc.RpcError as exc:
            raise ClientError(f"{member}: {_rpc_error(member, self._member(member)[1], exc)}") from None
        finally:
            if current is not None:
                current[1].close()
                current[3].unlink(missing_ok=True)
        if current is not None:
            raise ClientError(f"{member}: the result stream ended inside {current[0]!r}")
        return files
