"""The last public release of a job with data owners, kept by each compute party after its owner
intake has closed, and served to the job's owners by the daemon (``GetOwnerRelease``).

Why: the intake is the job worker's own server and stops with the job. An owner of a one-release
job that sent its shares and left (``mpc-erm owner join --leave``, the two-server model's own flow:
a phone or a clinic's laptop need not stay online while thousands of others send theirs), or an
owner that was counted in the last round but had not read its release when the intake stopped,
would otherwise be charged for a model it never receives. The file holds only what the compute
parties revealed to every member of the job in that round; it lives under a dot directory, which
the daemon never serves as the job's result (``parties.job_store.result_files``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .attest import Roster

__all__ = ["RELEASE_FILE", "StoredRelease", "read_release", "write_release"]

RELEASE_FILE = Path(".owners") / "last_release.safetensors"


@dataclass(frozen=True)
class StoredRelease:
    """One round's public release, as the owner intake published it."""

    job_id: str
    spec_digest: str
    round: int
    state: torch.Tensor  # float64
    roster: Roster  # the owners it counted and refused (signed with it)
    signatures: tuple[bytes, ...] = ()  # every compute party's, rank order (.attest): the owner checks them


def write_release(job_dir: str | Path, rel: StoredRelease) -> None:
    """Keep ``rel`` as the job's last release: written whole, made durable, renamed into place (a
    crash leaves the previous file or none, never half of one)."""
    from safetensors.torch import save_file

    path = Path(job_dir) / RELEASE_FILE
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file({"state": rel.state.detach().to("cpu", torch.float64).contiguous()}, str(tmp),
              metadata={"job_id": rel.job_id, "spec_digest": rel.spec_digest, "round": str(rel.round),
                        "counted": rel.roster.counted.hex(), "refused": rel.roster.refused.hex(),
                        "signatures": ",".join(sig.hex() for sig in rel.signatures)})
    with tmp.open("rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_release(job_dir: str | Path) -> StoredRelease | None:
    """The job's kept release, or None if there is none or it cannot be read whole (a deleted,
    truncated or foreign file is never served as a release)."""
    from safetensors import safe_open

    path = Path(job_dir) / RELEASE_FILE
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            state = f.get_tensor("state")
        if state.dtype != torch.float64:
            return None
        sigs = tuple(bytes.fromhex(x) for x in meta.get("signatures", "").split(",") if x)
        return StoredRelease(job_id=meta["job_id"], spec_digest=meta["spec_digest"], round=int(meta["round"]),
                             state=state, roster=Roster(bytes.fromhex(meta["counted"]), bytes.fromhex(meta["refused"])),
                             signatures=sigs)
    except Exception:  # OSError, a missing key, or safetensors' own error for a damaged file
        return None
