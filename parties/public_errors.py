"""What a failure may say outside the party: a code and a fixed-form public reason.

A job's failure reason leaves the party that failed in several ways: the job record's ``reason``
(served by ``GetStatus``, ``Watch`` and ``ListJobs`` to the coordinator, and by ``GetResult``), and
``GetEndpoint``'s refusal to another member whose worker still looks for this one's transport (that
member's worker then fails with it, and logs it in *its* daemon log and job table — the dealer's
too). An exception's own text is not fit for that: a data-file error names the party's file path,
the offending column and the private value (``regression labels must lie in [-1, 1] …; row 1 has
450000.0``), a solver error prints objective values, a schema mismatch would name the columns.

So every failure that crosses the boundary is ``"<CODE>: <public reason>"``, where the reason names
only public things — the job id, the data set id, member names, the phase the job was in, the
exception's type, job-file field names — and the detail (the exception text, its traceback, file
paths, values, column names) is logged only in the party's own daemon log (``state_dir/daemon.log``,
written by the worker process). Codes:

========== ================================================================================
DATA_SCHEMA the party's rows of the data set failed a check (labels, values, columns, format)
DATA_FILE   the party's data file could not be read (missing, unreadable, too large)
AGREEMENT   the members hold different jobs, different data set schemas, or a different order
PEER_LOST   another member could not be reached, went away, or timed out
PEER_FAILED another member's job ended (failed or cancelled there) before this one could start
CANCELLED   the job was cancelled (by the coordinator, or its daemon went away)
BUDGET      the party's privacy-budget ledger refused the job's charge
POLICY      the party's policy refuses what the job asks (the job-file field is named)
JOB_SPEC    the job file asks for something this party cannot run (the field is named)
SOLVER      the party's local solve did not reach its certified tolerance
STORAGE     the party's state directory (ledger, audit log, results) is full or cannot be written
STALLED     the party's own job worker made no progress (stopped, hung) for longer than peer_timeout_s
INTEGRITY   the compute parties' views differ (a release, their set-up) or a sampler stalled: nothing more is used
INTERNAL    anything else (a bug, out of memory): the type is named, the text is not
========== ================================================================================

Reasons the daemon writes itself (restart, stop, cancel by a coordinator, admission deadlock, a
worker that exited without reporting) are fixed texts of public facts and stay as they are.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterable, Sequence

__all__ = [
    "CODES",
    "PeerTimeout",
    "PublicError",
    "code_of",
    "data_failure",
    "peer_lookup_failure",
    "peer_lookup_timeout",
    "public_failure",
    "storage_problem",
]

CODES = ("DATA_SCHEMA", "DATA_FILE", "AGREEMENT", "PEER_LOST", "PEER_FAILED", "CANCELLED", "BUDGET", "POLICY",
         "JOB_SPEC", "SOLVER", "STORAGE", "STALLED", "INTEGRITY", "INTERNAL")
MAX_PUBLIC = 500  # a public reason is one short line
# A message that starts with a job-file field ("privacy.mechanism: ...", "job.test_no_noise: ..."):
# the wording of the project's own checks of the job file, fit to pass as it is.
_JOB_FIELD = re.compile(r"(?:job|privacy|model|training|method|device)(?:\.[a-z_]+)*: [^\n]+")
_GRPC_CODES = ("CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
               "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
               "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")
# GetEndpoint's refusal for a job that ended at the peer: "job J is failed at carol: CODE: ..."
_PEER_ENDED = re.compile(r"\bis (failed|cancelled|succeeded) at [A-Za-z0-9._-]+(?:: ([A-Z][A-Z_]+):)?")
# DataError texts about the file itself rather than its rows
_FILE_LEVEL = ("max_bytes", "file is empty", "not a readable", "cannot read", "not a text file", "not a NumPy",
               "No such file", "Permission denied")


class PublicError(RuntimeError):
    """A failure whose public side is fixed: ``code`` and ``public`` may cross the party's boundary;
    ``str()`` is the detail (for the party's own log), or the public reason when there is none."""

    def __init__(self, code: str, public: str, detail: str | None = None) -> None:
        if code not in CODES:
            raise ValueError(f"unknown public error code {code!r}")
        super().__init__(detail if detail else public)
        self.code, self.public, self.detail = code, _line(public), detail

    @property
    def reason(self) -> str:
        """What crosses the boundary: ``"<CODE>: <public reason>"``."""
        return f"{self.code}: {self.public}"


class PeerTimeout(PublicError, TimeoutError):
    """A member's endpoint was not published in time (a TimeoutError naming the member, as the
    worker contract says)."""


def _line(text: str) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= MAX_PUBLIC else s[: MAX_PUBLIC - 3] + "..."


def code_of(reason: str | None) -> str | None:
    """The code a public reason starts with (None for a daemon's own fixed reasons)."""
    if not reason:
        return None
    head = reason.split(":", 1)[0]
    return head if head in CODES else None


def _mentioned(text: str, members: Iterable[str], me: str | None) -> list[str]:
    """The members (other than ``me``) a message names, in the order they first appear."""
    found = []
    for m in members:
        if m == me or not m:
            continue
        hit = re.search(rf"(?<![A-Za-z0-9_.-]){re.escape(m)}(?![A-Za-z0-9_-])", text)
        if hit:
            found.append((hit.start(), m))
    return [m for _, m in sorted(found)]


def _names(members: Sequence[str]) -> str:
    return ", ".join(repr(m) for m in members)


def _is(exc: BaseException, *class_names: str) -> bool:
    """By name along the MRO: this module imports neither the transport nor the worker."""
    return any(c.__name__ in class_names for c in type(exc).__mro__)


_PEER_ERRORS = ("TransportError", "DealerJobAborted", "DealerError")


def _peer_error(exc: BaseException) -> BaseException | None:
    """The share-transport (or dealer) error behind ``exc``, if any: itself, or one it was raised
    from or while handling (CrypTen and the protocols may re-raise a peer's loss as another type)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen and len(seen) < 16:
        seen.add(id(e))
        if _is(e, *_PEER_ERRORS) or isinstance(e, TimeoutError):
            return e
        e = e.__cause__ or e.__context__
    return None


_STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG)
_SQLITE_STORAGE = ("SQLITE_FULL", "SQLITE_IOERR", "SQLITE_READONLY", "SQLITE_CANTOPEN")


def storage_problem(exc: BaseException) -> str | None:
    """For a failure to write the party's own state (disk full, I/O error, read-only, quota): a
    public one-word-and-text description (``ENOSPC: No space left on device``, ``SQLITE_FULL:
    database or disk is full``); None for anything else. No path, no value."""
    if isinstance(exc, OSError) and exc.errno in _STORAGE_ERRNOS:
        return f"{errno.errorcode[exc.errno]}: {os.strerror(exc.errno)}"
    if _is(exc, "OperationalError"):
        name = str(getattr(exc, "sqlite_errorname", "") or "")
        text = " ".join(str(exc).split())
        if name.startswith(_SQLITE_STORAGE) or text in ("database or disk is full", "disk I/O error"):
            return f"{name or 'SQLite'}: {text}"[:120]
    return None


def _during(phase: str | None) -> str:
    return f" during phase {phase!r}" if phase else ""


def data_failure(exc: BaseException, dataset: str, party: str) -> PublicError:
    """The public form of an error raised while reading a party's rows of ``dataset``."""
    detail = " ".join(str(exc).split()) or type(exc).__name__
    file_level = isinstance(exc, (OSError, MemoryError)) or any(k in detail for k in _FILE_LEVEL)
    if file_level:
        return PublicError("DATA_FILE", f"data set {dataset!r} could not be read at party {party}; "
                                        "see that party's log", detail)
    return PublicError("DATA_SCHEMA", f"data set {dataset!r} failed its schema check at party {party}; "
                                      "see that party's log", detail)


def peer_lookup_timeout(member: str, job_id: str, timeout_s: float, detail: str) -> PeerTimeout:
    return PeerTimeout("PEER_LOST", f"endpoint of {member!r} for job {job_id} not published within "
                                    f"{timeout_s:g} s (peer_timeout_s)", detail)


def peer_lookup_failure(member: str, job_id: str, detail: str) -> PublicError:
    """Why looking up ``member``'s endpoint failed for good, from the daemon's text: the job ended
    there (its own public code, not its text, is repeated), or its daemon refused."""
    ended = _PEER_ENDED.search(detail)
    if ended:
        status, code = ended.group(1), ended.group(2) if ended.group(2) in CODES else None
        what = f"job {job_id} {'was ' if status == 'cancelled' else ''}{status} at {member!r}" + (
            f" ({code})" if code else "")
        return PublicError("CANCELLED" if status == "cancelled" else "PEER_FAILED",
                           f"{what} before this member could connect; see {member}'s status", detail)
    if "job cancelled or daemon stopping" in detail:
        return PublicError("CANCELLED", f"job {job_id} cancelled (or its daemon stopping) while looking up "
                                        f"{member!r}'s endpoint", detail)
    if detail.startswith("admission deadlock:"):  # the daemon's own public reason
        return PublicError("PEER_LOST", detail, detail)
    grpc_code = next((c for c in _GRPC_CODES if re.search(rf"\b{c}\b", detail)), None)
    return PublicError("PEER_LOST", f"the daemon of {member!r} refused the endpoint look-up for job {job_id}"
                                    + (f" ({grpc_code})" if grpc_code else ""), detail)


def public_failure(exc: BaseException, *, member: str, job_id: str, dataset: str | None = None,
                   phase: str | None = None, members: Sequence[str] = ()) -> tuple[str, str]:
    """(code, ``"<CODE>: <public reason>"``) for a job's failure at ``member`` (a party or the
    dealer). ``members`` are the job's member names (public): a peer error names the ones its text
    mentions. Nothing of the exception's text passes, except the project's own job-file field
    refusals and cancellation messages, which are public by construction."""
    if isinstance(exc, PublicError):
        return exc.code, exc.reason
    text = " ".join(str(exc).split())
    kind = type(exc).__name__
    code: str
    if _is(exc, "JobCancelled"):
        code, public = "CANCELLED", text or "cancelled"
    elif _is(exc, "IntegrityError"):  # its text names members, what disagreed and digest prefixes only
        code, public = "INTEGRITY", f"at {member}: {text}"
    elif _is(exc, "DataError"):
        err = data_failure(exc, dataset or "?", member)
        code, public = err.code, err.public
    elif (peer := _peer_error(exc)) is not None:
        peers = _mentioned(" ".join(str(peer).split()), members, member)
        code = "PEER_LOST"
        public = (f"{member} lost contact with {_names(peers) if peers else 'a peer'}{_during(phase)} "
                  f"({type(peer).__name__}{'' if peer is exc else ', raised as ' + kind}); see {member}'s log")
    elif _is(exc, "LedgerError"):
        code, public = "BUDGET", (f"the privacy budget ledger of {member} refused job {job_id}"
                                  + (f" on data set {dataset!r}" if dataset else "") + f"; see {member}'s log")
    elif _is(exc, "LocalSolveError", "ConvergenceError"):
        code, public = "SOLVER", (f"the local solve at {member} did not reach its certified tolerance; "
                                  f"see {member}'s log")
    elif isinstance(exc, (ValueError, PermissionError)) and _JOB_FIELD.fullmatch(text):
        code, public = ("POLICY" if isinstance(exc, PermissionError) else "JOB_SPEC"), text
    elif _is(exc, "NotForProductionError"):
        code, public = "POLICY", f"{member}'s policy refuses a test-only (zero-noise) aggregate; see {member}'s log"
    elif (disk := storage_problem(exc)) is not None:
        code, public = "STORAGE", (f"the state directory of {member} is full or cannot be written{_during(phase)} "
                                   f"({disk}); see {member}'s log")
    elif isinstance(exc, MemoryError):
        code, public = "INTERNAL", f"out of memory at {member}{_during(phase)}; see {member}'s log"
    else:
        code, public = "INTERNAL", f"internal error at {member}{_during(phase)} ({kind}); see {member}'s log"
    return code, f"{code}: {_line(public)}"
