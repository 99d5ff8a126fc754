"""What a failure may say outside the party (parties.public_errors): codes and public reasons.

Fast, in-process: the classification of each kind of failure, the worker's data loading and schema
agreement. The same with real daemons, end to end: tests/reliability/test_error_boundary.py.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mpc_erm.data import DataError
from mpc_erm.mpc.transport.errors import PeerUnavailable, TransportTimeout
from parties.context import JobCancelled
from parties.ledger import BudgetExceeded
from parties.public_errors import (
    CODES,
    PeerTimeout,
    PublicError,
    code_of,
    data_failure,
    peer_lookup_failure,
    peer_lookup_timeout,
    public_failure,
)

MEMBERS = ("alice", "bob", "carol", "dealer")
SECRET_PATH = "/srv/stmarys-private/housing.csv"


def classify(exc: BaseException, member: str = "carol", phase: str | None = "training") -> tuple[str, str]:
    return public_failure(exc, member=member, job_id="j1", dataset="housing", phase=phase, members=MEMBERS)


def test_a_data_error_leaves_only_the_data_set_and_the_party() -> None:
    exc = DataError(f"{SECRET_PATH}: regression labels must lie in [-1, 1] (pass public label_bounds=(low, high) "
                    "to rescale); row 1 has 450000.0")
    code, reason = classify(exc)
    assert (code, reason) == ("DATA_SCHEMA", "DATA_SCHEMA: data set 'housing' failed its schema check at party carol; "
                                             "see that party's log")
    err = data_failure(exc, "housing", "carol")
    assert "450000.0" in str(err) and SECRET_PATH in str(err)  # the detail, for the party's own log
    assert "450000" not in err.reason and "stmarys" not in err.reason


@pytest.mark.parametrize("exc", [FileNotFoundError(2, "No such file or directory", SECRET_PATH),
                                 DataError(f"{SECRET_PATH}: file is 9,999 bytes, larger than max_bytes=100"),
                                 MemoryError()])
def test_an_unreadable_data_file_is_data_file(exc: BaseException) -> None:
    err = data_failure(exc, "housing", "carol")
    assert err.reason == "DATA_FILE: data set 'housing' could not be read at party carol; see that party's log"


@pytest.mark.parametrize(("exc", "code", "reason"), [
    (JobCancelled("cancelled by the coordinator"), "CANCELLED", "CANCELLED: cancelled by the coordinator"),
    (ValueError("privacy.mechanism: 'l2_laplace' is not sampled inside the MPC"), "JOB_SPEC",
     "JOB_SPEC: privacy.mechanism: 'l2_laplace' is not sampled inside the MPC"),
    (ValueError("device: 'cuda' requested but no CUDA device is available to this party"), "JOB_SPEC",
     "JOB_SPEC: device: 'cuda' requested but no CUDA device is available to this party"),
    (PermissionError("job.test_no_noise: refused (this party's policy.allow_test_only is false)"), "POLICY",
     "POLICY: job.test_no_noise: refused (this party's policy.allow_test_only is false)"),
    (PeerUnavailable("job j1: broadcast: message #3 from party 0 'alice' at 10.0.0.1:4000: the peer went away"),
     "PEER_LOST", "PEER_LOST: carol lost contact with 'alice' during phase 'training' (PeerUnavailable); "
                  "see carol's log"),
    (TransportTimeout("job j1: all_reduce: message #7 from party 1 'bob' at h:1 did not arrive within 120.0 s"),
     "PEER_LOST", "PEER_LOST: carol lost contact with 'bob' during phase 'training' (TransportTimeout); "
                  "see carol's log"),
    (BudgetExceeded("housing", "j1", (1.0, 0.0), 0.5, 0.0, (1.0, 1e-5), 0.0), "BUDGET",
     "BUDGET: the privacy budget ledger of carol refused job j1 on data set 'housing'; see carol's log"),
    (RuntimeError("objective 0.4412 at theta = [0.12, -3.4]; file /srv/x.csv"), "INTERNAL",
     "INTERNAL: internal error at carol during phase 'training' (RuntimeError); see carol's log"),
    (ValueError("/srv/rows.csv: something: 1.5"), "INTERNAL",  # not a job-file field: nothing of the text
     "INTERNAL: internal error at carol during phase 'training' (ValueError); see carol's log"),
    (MemoryError(), "INTERNAL", "INTERNAL: out of memory at carol during phase 'training'; see carol's log"),
])
def test_each_kind_of_failure_has_its_code_and_public_reason(exc: BaseException, code: str, reason: str) -> None:
    assert classify(exc) == (code, reason)
    assert code_of(reason) == code and code in CODES


def test_a_peer_loss_raised_as_another_type_still_names_the_peer() -> None:
    try:
        try:
            raise PeerUnavailable("job j1: b2a: message #9 from dealer 3 'dealer' at h:4: the peer went away")
        except PeerUnavailable as exc:
            raise RuntimeError("crypten: request failed") from exc
    except RuntimeError as exc:
        code, reason = classify(exc, phase=None)
    assert (code, reason) == ("PEER_LOST", "PEER_LOST: carol lost contact with 'dealer' (PeerUnavailable, raised as "
                                           "RuntimeError); see carol's log")


def test_a_solver_failure_prints_no_objective() -> None:
    from mpc_erm.protocols.output_perturbation import LocalSolveError

    code, reason = classify(LocalSolveError("gradient norm 3.1e-4 > tol at objective 0.69314718"))
    assert code == "SOLVER" and "0.69" not in reason and "3.1e-4" not in reason, reason


def test_a_public_error_passes_as_it_is_and_keeps_its_detail() -> None:
    err = PublicError("AGREEMENT", "dataset schema mismatch: party 'bob' has different features", "columns 'age'")
    assert classify(err) == ("AGREEMENT", "AGREEMENT: dataset schema mismatch: party 'bob' has different features")
    assert str(err) == "columns 'age'"
    with pytest.raises(ValueError, match="unknown public error code"):
        PublicError("OOPS", "x")


def test_a_peer_lookup_names_the_peer_and_only_its_code() -> None:
    text = ("carol's daemon: FAILED_PRECONDITION: job j1 is failed at carol: DATA_SCHEMA: data set 'housing' failed "
            "its schema check at party carol; see that party's log; budget released (nothing was revealed)")
    err = peer_lookup_failure("carol", "j1", text)
    assert isinstance(err, RuntimeError) and str(err) == text
    assert err.reason == ("PEER_FAILED: job j1 failed at 'carol' (DATA_SCHEMA) before this member could connect; "
                          "see carol's status")
    # what GetEndpoint now tells another member: the status and the code, nothing of the reason's text
    err = peer_lookup_failure("carol", "j1", "carol's daemon: FAILED_PRECONDITION: job j1 is failed at carol: "
                                             "DATA_SCHEMA: see carol's status")
    assert err.reason == ("PEER_FAILED: job j1 failed at 'carol' (DATA_SCHEMA) before this member could connect; "
                          "see carol's status")
    # a peer whose reason is not in this form (another version, a hostile peer): its text is not repeated
    err = peer_lookup_failure("carol", "j1", "carol's daemon: FAILED_PRECONDITION: job j1 is failed at carol: "
                                             "ValueError: /srv/x.csv row 1 has 450000.0")
    assert err.reason == "PEER_FAILED: job j1 failed at 'carol' before this member could connect; see carol's status"
    err = peer_lookup_failure("bob", "j1", "bob's daemon: FAILED_PRECONDITION: job j1 is cancelled at bob: "
                                           "cancelled by coord: x")
    assert err.code == "CANCELLED" and "'bob'" in err.reason
    err = peer_lookup_failure("bob", "j1", "bob's daemon: PERMISSION_DENIED: party/alice may not call ...")
    assert err.reason == "PEER_LOST: the daemon of 'bob' refused the endpoint look-up for job j1 (PERMISSION_DENIED)"
    t = peer_lookup_timeout("bob", "j1", 120.0, "endpoint of 'bob' ... (last: NOT_FOUND: ...)")
    assert isinstance(t, TimeoutError) and isinstance(t, PeerTimeout)
    assert t.reason == "PEER_LOST: endpoint of 'bob' for job j1 not published within 120 s (peer_timeout_s)"


# --------------------------------------------------------------------------- the worker's side


def _ctx(tmp_path: Path, rows: str, model: str = "ridge") -> Any:
    from parties.config import DatasetConfig

    path = tmp_path / "stmarys-private" / "housing.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(rows)
    cfg = DatasetConfig(format="csv", path=path, label="y", epsilon=1.0, delta=1e-5)
    job = SimpleNamespace(job=SimpleNamespace(dataset="housing", parties=("alice", "bob", "carol")),
                          spec=SimpleNamespace(model=SimpleNamespace(name=model, is_network=False), federated=None),
                          spec_digest=lambda: "d" * 64)
    return SimpleNamespace(job=job, config=SimpleNamespace(datasets={"housing": cfg}),
                           identity=SimpleNamespace(name="stmarys"))


def test_the_worker_wraps_a_bad_data_file(tmp_path: Path) -> None:
    from parties.rows import load_rows

    ctx = _ctx(tmp_path, "a,b,y\n0.1,0.2,0.5\n0.3,0.1,450000.0\n")
    with pytest.raises(PublicError) as info:
        load_rows(ctx)
    err = info.value
    assert err.reason == ("DATA_SCHEMA: data set 'housing' failed its schema check at party stmarys; "
                          "see that party's log")
    assert "450000.0" in str(err) and "stmarys-private" in str(err)  # the detail, for the log
    assert isinstance(err.__cause__, DataError)
    rows = load_rows(_ctx(tmp_path, "a,b,y\n0.1,0.2,0.5\n0.3,0.1,-0.25\n"))
    ds, test = rows.train, rows.test
    assert ds.n == 2 and test is None


class _Comm:
    """broadcast_obj over fixed per-rank objects (rank 0 is the caller)."""

    def __init__(self, objs: list[dict[str, Any]]) -> None:
        self.objs = objs

    def get_rank(self) -> int:
        return 0

    def get_world_size(self) -> int:
        return len(self.objs)

    def broadcast_obj(self, obj: Any, src: int) -> Any:
        return obj if src == 0 else self.objs[src]


def test_a_schema_mismatch_names_the_party_publicly_and_the_columns_only_in_the_detail() -> None:
    from parties.rows import Rows
    from parties.session import AgreementError, column_digests, schema_digest
    from parties.session import agree as _agree

    def ds(cols: tuple[str, ...]) -> Any:
        return SimpleNamespace(feature_names=cols, task="binary", n_classes=None, n=10)

    mine, theirs = ds(("age", "income_band", "zip")), ds(("age", "carol_secret_col", "zip"))
    job = SimpleNamespace(job=SimpleNamespace(dataset="survey", parties=("alice", "bob", "carol")),
                          spec=SimpleNamespace(privacy=SimpleNamespace(adjacency="replace")),
                          spec_digest=lambda: "d" * 64)
    ctx = SimpleNamespace(job=job, identity=SimpleNamespace(name="alice"))

    def obj(name: str, d: Any) -> dict[str, Any]:
        return {"digest": "d" * 64, "schema": schema_digest(d), "n": 10, "name": name,
                "columns": column_digests(d, "d" * 64)}

    with pytest.raises(AgreementError) as info:
        _agree(ctx, _Comm([obj("alice", mine), obj("bob", mine), obj("carol", theirs)]), Rows(mine))
    err = info.value
    assert err.code == "AGREEMENT" and err.reason == (
        "AGREEMENT: dataset schema mismatch: party 'carol' has different features for 'survey' than 'alice'; "
        "nothing revealed; each party's log names its own differing columns")
    assert "our columns that differ: 'income_band'" in str(err)  # ours, for our log
    assert "carol_secret_col" not in str(err) and "carol_secret_col" not in err.reason  # theirs never reached us
    assert _agree(ctx, _Comm([obj("alice", mine), obj("bob", mine), obj("carol", mine)]), Rows(mine)) == [10, 10, 10]


def test_a_validation_split_holds_out_the_same_rows_every_job_and_trains_on_none_of_them() -> None:
    """``validation_fraction``: round(f·n) rows held out, disjoint from the training rows, the
    same ones for every job on the data set (a fixed permutation); too few rows is refused."""
    import numpy as np

    from mpc_erm.data import Dataset
    from parties.rows import split_validation

    X = np.arange(200, dtype=float).reshape(100, 2)
    ds = Dataset(X, np.where(np.arange(100) % 2 == 0, 1.0, -1.0), "binary", "toy", ["a", "b"], 2)
    tr, va = split_validation(ds, 0.2)
    assert (tr.n, va.n) == (80, 20)
    assert not set(tr.X[:, 0]) & set(va.X[:, 0]) and set(tr.X[:, 0]) | set(va.X[:, 0]) == set(X[:, 0])
    assert np.array_equal(split_validation(ds, 0.2)[1].X, va.X)  # the same rows next job
    assert split_validation(ds, 0.0) == (ds, None)
    one = Dataset(X[:1], np.ones(1), "binary", "one", ["a", "b"], 2)
    with pytest.raises(ValueError, match="validation_fraction: 0.5 of 1 rows leaves none"):
        split_validation(one, 0.5)


def test_members_holding_different_public_test_sets_are_refused_naming_them() -> None:
    """A public test set is public among the members, and each member publishes its curve on its
    own: two different files would give one model two curves, so the agreement refuses them;
    a member without one is fine (it publishes no curve)."""
    import numpy as np

    from mpc_erm.data import Dataset
    from parties.rows import Rows
    from parties.session import AgreementError, column_digests, rows_digest, schema_digest
    from parties.session import agree as _agree

    train = SimpleNamespace(feature_names=("age", "bmi"), task="binary", n_classes=None, n=10)
    X = np.array([[0.1, 0.2], [0.3, -0.4]])
    test = Dataset(X, np.array([1.0, -1.0]), "binary", "t", ["age", "bmi"], 2)
    other = Dataset(X, np.array([1.0, 1.0]), "binary", "t", ["age", "bmi"], 2)  # one label differs
    assert rows_digest(test) == rows_digest(Dataset(X.copy(), np.array([1.0, -1.0]), "binary", "u", ["age", "bmi"],
                                                      2))
    assert rows_digest(test) != rows_digest(other) and rows_digest(None) is None
    job = SimpleNamespace(job=SimpleNamespace(dataset="survey", parties=("alice", "bob", "carol")),
                          spec=SimpleNamespace(privacy=SimpleNamespace(adjacency="add_remove")),
                          spec_digest=lambda: "d" * 64)
    ctx = SimpleNamespace(job=job, identity=SimpleNamespace(name="alice"))

    def obj(name: str, t: Any) -> dict[str, Any]:
        return {"digest": "d" * 64, "schema": schema_digest(train), "n": None, "name": name,
                "columns": column_digests(train, "d" * 64), "public_test": rows_digest(t)}

    with pytest.raises(AgreementError) as info:
        _agree(ctx, _Comm([obj("alice", test), obj("bob", None), obj("carol", other)]), Rows(train, test))
    assert "public test set mismatch for 'survey'" in info.value.reason and "'carol'" in info.value.reason
    assert "'bob'" not in info.value.reason  # bob holds none: he publishes no curve, and is not at fault
    assert _agree(ctx, _Comm([obj("alice", test), obj("bob", None), obj("carol", test)]), Rows(train, test)) is None
