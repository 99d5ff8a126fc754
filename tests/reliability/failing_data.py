"""Jobs that fail on one party's private data, and the check that the failure's detail stays there.

Used by ``test_error_boundary.py`` (the regression test of issue 13, item 7) and ``test_leaks.py``
(whose scan covers these failure paths too). After :meth:`LocalConsortium.write`,
:func:`add_datasets` gives every party three small CSV data sets, each party's file under its own
directory; the victim's (carol's) files are bad, and what is bad is distinctive, so that it can be
searched for in every other member's files and in everything the coordinator received:

* ``housing`` (ridge regression): a label of 451234.5 in row 2 (the loader refuses labels outside [-1, 1]);
* ``claims`` (logistic, binary): a text label ``zebra-7731``;
* ``survey`` (logistic): a different second column (``carol_secret_col`` where the others have
  ``income_band``): the schema agreement fails at every party.

The victim's file path holds ``carol-private-7f3a``. A party's failure may leave it only as a code and
a public reason (parties.public_errors); the loader's message (path, value) and the columns stay in
the party's own log.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VICTIM = "carol"
SECRET_DIR = "carol-private-7f3a"  # in the victim's data file paths
LABEL_VALUE = "451234.5"  # the victim's out-of-range regression label
TEXT_LABEL = "zebra-7731"  # the victim's text label in a binary data set
OWN_COLUMN = "income_band"  # the other parties' second column of "survey"
VICTIM_COLUMN = "carol_secret_col"  # the victim's second column of "survey"
VICTIM_SECRETS = (SECRET_DIR, LABEL_VALUE, "451234", TEXT_LABEL, VICTIM_COLUMN)
ROWS = 24


@dataclass(frozen=True)
class FailingJob:
    name: str  # the job's name (and the key in a test's results)
    dataset: str
    model: str  # "ridge" (regression) or "logistic" (binary)
    victim_code: str  # the code the victim's own reason carries
    victim_reason: str  # the public wording at the victim
    others_codes: tuple[str, ...]  # codes the other members may end with
    own_detail: tuple[str, ...]  # what the victim's own log must hold (the detail stayed there)


FAILING_JOBS = (
    FailingJob("eb-label-range", "housing", "ridge", "DATA_SCHEMA",
               "DATA_SCHEMA: data set 'housing' failed its schema check at party carol; see that party's log",
               ("PEER_FAILED", "PEER_LOST"), (LABEL_VALUE, SECRET_DIR)),
    FailingJob("eb-label-text", "claims", "logistic", "DATA_SCHEMA",
               "DATA_SCHEMA: data set 'claims' failed its schema check at party carol; see that party's log",
               ("PEER_FAILED", "PEER_LOST"), (TEXT_LABEL, SECRET_DIR)),
    FailingJob("eb-schema", "survey", "logistic", "AGREEMENT",
               "AGREEMENT: dataset schema mismatch: parties 'alice', 'bob' have different features for 'survey' "
               "than 'carol'; nothing revealed",
               ("AGREEMENT", "PEER_FAILED", "PEER_LOST"), (VICTIM_COLUMN,)),
)


def _csv(columns: Sequence[str], label_of: Any, seed: int) -> str:
    lines = [",".join([*columns, "y"])]
    for i in range(ROWS):
        a, b = ((i * 7 + seed) % 10) / 20, ((i * 3 + seed) % 10) / 20
        lines.append(f"{a},{b},{label_of(i)}")
    return "\n".join(lines) + "\n"


def add_datasets(party_configs: dict[str, Path], victim: str = VICTIM, epsilon: float = 5.0,
                 data_root: Path | None = None) -> None:
    """Write each party's CSVs (under ``<its config's dir, or data_root/party>/<private dir>/``) and
    offer them in its config."""
    for k, (party, config) in enumerate(sorted(party_configs.items())):
        bad = party == victim
        d = (config.parent if data_root is None else data_root / party) / (SECRET_DIR if bad else f"{party}-data")
        d.mkdir(parents=True, exist_ok=True)
        files = {
            "housing": _csv(("a", "b"), lambda i, bad=bad: LABEL_VALUE if bad and i == 1 else f"{(i % 9 - 4) / 5:g}",
                            k),
            "claims": _csv(("a", "b"), lambda i, bad=bad: TEXT_LABEL if bad and i == 2 else str(i % 2), k),
            "survey": _csv(("a", VICTIM_COLUMN if bad else OWN_COLUMN), lambda i: str(i % 2), k),
        }
        lines = []
        for name, text in files.items():
            (d / f"{name}.csv").write_text(text)
            lines += ["", f"[datasets.{name}]", 'format = "csv"', f'path = "{d / (name + ".csv")}"', 'label = "y"',
                      f"epsilon = {epsilon!r}", "delta = 1e-4"]
        config.write_text(config.read_text() + "\n".join(lines) + "\n")


def job_toml(job: FailingJob, parties: Sequence[str], dealer: str | None) -> str:
    plist = ", ".join(f'"{p}"' for p in parties)
    return (f'method = "output"\n\n[job]\nname = "{job.name}"\ndataset = "{job.dataset}"\nparties = [{plist}]\n'
            + (f'trust = "dealer"\ndealer = "{dealer}"\n' if dealer else 'trust = "replicated"\n')
            + f'device = "cpu"\n\n[model]\nname = "{job.model}"\nlam = 0.01\n\n'
            '[privacy]\nepsilon = 0.5\ndelta = 1e-5\nmechanism = "gaussian"\n')


def _files(base: Path) -> Iterable[Path]:
    return (p for p in sorted(base.rglob("*")) if p.is_file() and "pki" not in p.parts)


def crossings(root: Path, members: Iterable[str], victim: str = VICTIM, *,
              coordinator_output: Iterable[bytes] = ()) -> list[str]:
    """Where the victim's private detail reached another member's directory (logs, job tables,
    ledgers, state) or the coordinator; and where another party's column name reached the victim."""
    found = []
    for m in members:
        needles = VICTIM_SECRETS if m != victim else (OWN_COLUMN,)
        for p in _files(root / m):
            blob = p.read_bytes()
            found += [f"{p.relative_to(root)}: {n!r}" for n in needles if n.encode() in blob]
    for i, blob in enumerate(coordinator_output):
        found += [f"coordinator output #{i}: {n!r}" for n in VICTIM_SECRETS if n.encode() in blob]
    return found


def own_log(root: Path, member: str) -> str:
    """Everything the member's daemon and its workers logged (its state dir's log and its stderr)."""
    return "\n".join(p.read_text(errors="replace") for p in _files(root / member) if p.name == "daemon.log")


def reason_problems(job: FailingJob, statuses: dict[str, dict[str, Any]], victim: str = VICTIM) -> list[str]:
    """What is wrong with the job's end as the coordinator sees it (GetStatus at every member)."""
    out = []
    for m, st in statuses.items():
        reason = st.get("reason") or ""
        if st.get("status") != "failed":
            out.append(f"{m}: {st.get('status')} ({reason})")
            continue
        code = reason.split(":", 1)[0]
        if m == victim:
            if not reason.startswith(job.victim_reason):
                out.append(f"{victim}: reason {reason!r} is not {job.victim_reason!r}")
        elif code not in job.others_codes:
            out.append(f"{m}: code {code!r} not in {job.others_codes}: {reason!r}")
    return out


def dump(obj: Any) -> bytes:
    return json.dumps(obj, default=str).encode()
