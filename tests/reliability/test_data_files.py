"""Hostile data files: each is refused with a reason naming the file and the column, row or line,
or read in bounded memory — never an out-of-memory crash, never another exception type.

Through ``mpc_erm.data.loaders.load_file`` (what the party's job worker calls with its config's
``format``, ``label``, ``max_bytes`` and ``feature_range``); a 1 GiB file in a subprocess whose
peak RSS is measured; and (slow) a real party daemon whose real worker meets a bad CSV: the job
fails with a public reason (the file and row only in the party's own log), and its budget
reservation is released.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from mpc_erm.data import DataError
from mpc_erm.data.loaders import load_file

from .faults import stop_process_group, wait_for

pytestmark = pytest.mark.reliability

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _npz_lying_header() -> bytes:
    """An .npz whose X.npy header declares 10^12 x 10^3 float64 (8 PB) over 16 bytes of data."""
    header = "{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000, 1000), }"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    npy = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + b"\x00" * 16
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("X.npy", npy)
        z.writestr("y.npy", npy)
    return buf.getvalue()


def _npz_pickled() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, X=np.array([[1.0, {"a": 1}]], dtype=object), y=np.array([1.0]))
    return buf.getvalue()


GARBAGE = bytes(np.random.default_rng(6).integers(0, 256, 4096, dtype=np.uint8))

# (name, format, file content, extra load_file arguments, fragment the refusal must contain)
CASES: list[tuple[str, str, bytes, dict, str]] = [
    ("csv_nan_feature", "csv", b"a,b,y\n1,2,1\n3,nan,0\n", {},
     "missing (NaN/empty) value in column 'b' at row 2 (line 3)"),
    ("csv_inf_feature", "csv", b"a,b,y\n1,-inf,1\n", {}, "infinite (-inf) value in column 'b' at row 1"),
    ("csv_overflow_feature", "csv", b"a,b,y\n1,1e999,1\n", {}, "infinite (inf) value in column 'b' at row 1"),
    ("csv_too_many_fields", "csv", b"a,b,y\n1,2,1\n1,2,3,4\n", {}, "malformed row"),
    ("csv_too_few_fields", "csv", b"a,b,y\n1,2,1\n1,2\n", {}, "label is missing at row 2"),
    ("csv_label_two", "csv", b"a,b,y\n1,2,1\n1,2,2\n", {}, "binary labels must be -1/+1, 0/1 or true/false"),
    ("csv_label_text", "csv", b"a,b,y\n1,2,yes\n", {}, "binary labels must be"),
    ("csv_multiclass_huge_label", "csv", b"a,y\n1,0\n1,999999999999\n", {"task": "multiclass"},
     "multiclass label at row 2 is '999999999999'; at most 10,000 classes"),
    ("csv_regression_label_inf", "csv", b"a,y\n1,inf\n", {"task": "regression"},
     "regression label at row 1 is not finite"),
    ("csv_regression_label_out", "csv", b"a,y\n1,0.5\n1,7\n", {"task": "regression"}, "row 2 has 7.0"),
    ("csv_outside_feature_range", "csv", b"a,b,y\n0.5,0.1,1\n0.2,3.5,0\n", {"feature_range": (0.0, 1.0)},
     "value 3.5 in column 'b' at row 2 (line 3) is outside the declared feature range [0, 1]"),
    ("csv_below_feature_range", "csv", b"a,y\n-2,1\n", {"feature_range": (-1.0, 1.0)}, "column 'a' at row 1"),
    ("csv_empty", "csv", b"", {}, "file is empty"),
    ("csv_blank_lines", "csv", b"\n\n   \n", {}, "file is empty"),
    ("csv_header_only", "csv", b"a,b,y\n", {}, "no data rows"),
    ("csv_no_label_column", "csv", b"a,b,c\n1,2,3\n", {}, "label column 'y' not found"),
    ("csv_duplicate_header", "csv", b"a,a,y\n1,2,1\n", {}, "duplicate column name(s) 'a' in the header"),
    ("csv_binary_garbage", "csv", GARBAGE, {}, "cannot read as text"),
    ("csv_latin1", "csv", b"a,y\n\xe9,1\n", {}, "not a text file"),
    ("csv_nul_cell", "csv", b"a,y\n1\x00,1\n", {}, "non-numeric value '1\\x00' in numeric column 'a' at row 1"),
    ("csv_5000_digit_cell", "csv", b"a,y\n" + b"9" * 5000 + b"x,1\n", {}, "non-numeric value '99999"),
    ("csv_unclosed_quote", "csv", b'a,y\n"1,1\n', {}, "cannot parse as delimited text"),
    ("csv_gzip_truncated", "csv", gzip.compress(b"a,y\n" + b"1,1\n" * 5000)[:60], {}, "not a readable gzip file"),
    ("csv_gzip_garbage", "csv", b"\x1f\x8b" + GARBAGE, {}, "not a readable gzip file"),
    ("csv_gzip_bomb", "csv", gzip.compress(b"a,y\n" + b"0,1\n" * (1 << 18), 9), {"max_bytes": 1 << 20},
     "decompresses to more than max_bytes=1,048,576 bytes"),
    ("csv_over_max_bytes", "csv", b"a,y\n" + b"1,1\n" * 100, {"max_bytes": 100}, "larger than max_bytes=100"),
    ("csv_5_mib_label_cell", "csv", b"a,y\n1," + b"1" * (5 << 20) + b"\n", {}, "binary labels must be"),
    ("csv_header_over_4mib", "csv", b"y" * (5 << 20) + b"\n1\n", {}, "line 1 is longer than"),
    ("libsvm_nan", "libsvm", b"1 1:0.5\n-1 2:nan\n", {}, "line 2: value of feature 2 is not finite"),
    ("libsvm_inf", "libsvm", b"1 1:inf\n", {}, "line 1: value of feature 1 is not finite"),
    ("libsvm_index_1e9", "libsvm", b"1 900000000:1\n", {},
     "line 1: feature index '900000000' makes the dense matrix 1 x 900,000,000, over max_cells"),
    ("libsvm_index_1e11", "libsvm", b"1 1:1\n-1 99999999999:1\n", {}, "line 2: feature index"),
    ("libsvm_not_index_value", "libsvm", b"1 1:1 2\n", {}, "line 1: token '2' is not 'index:value'"),
    ("libsvm_decreasing", "libsvm", b"1 3:1 2:1\n", {}, "line 1: feature index 2 is repeated or not increasing"),
    ("libsvm_zero_index", "libsvm", b"1 0:1\n", {}, "line 1: feature index 0 below 1"),
    ("libsvm_label_three", "libsvm", b"1 1:1\n3 1:1\n", {}, "binary labels must be"),
    ("libsvm_label_nan", "libsvm", b"nan 1:1\n", {}, "label is missing at line 1"),
    ("libsvm_outside_range", "libsvm", b"1 1:0.5\n-1 1:9\n", {"feature_range": (0.0, 1.0)},
     "line 2: value 9.0 of feature 1 is outside the declared feature range [0, 1]"),
    ("libsvm_empty", "libsvm", b"", {}, "file is empty"),
    ("libsvm_comments_only", "libsvm", b"# nothing\n# here\n", {}, "file is empty"),
    ("libsvm_garbage", "libsvm", GARBAGE, {}, "not a readable LIBSVM text file"),
    ("libsvm_line_over_4mib", "libsvm", b"1 " + b"1:1 " * (2 << 20) + b"\n", {}, "line 1 is longer than"),
    ("libsvm_gzip_bomb", "libsvm", gzip.compress(b"1 1:1\n" * (1 << 18), 9), {"max_bytes": 1 << 20},
     "decompresses to more than max_bytes"),
    ("npz_garbage", "npz", GARBAGE, {}, "not a NumPy .npy/.npz file"),
    ("npz_empty", "npz", b"", {}, "not a NumPy .npy/.npz file"),
    ("npz_nan_feature", "npz", _npz({"X": np.array([[1.0], [np.nan]]), "y": np.array([1.0, -1.0])}), {},
     "X has a non-finite value at row 1, column 0"),
    ("npz_inf_label", "npz", _npz({"X": np.zeros((1, 1)), "y": np.array([np.inf])}), {"task": "regression"},
     "regression labels must lie in [-1, 1]"),
    ("npz_label_two", "npz", _npz({"X": np.zeros((2, 1)), "y": np.array([1.0, 2.0])}), {},
     "binary labels must be -1/+1"),
    ("npz_outside_range", "npz", _npz({"X": np.array([[0.5, 2.0]]), "y": np.array([1.0])}),
     {"feature_range": (0.0, 1.0)}, "X has 2.0 at row 0, column 1, outside the declared feature range"),
    ("npz_no_columns", "npz", _npz({"X": np.zeros((2, 0)), "y": np.array([1.0, -1.0])}), {},
     "X has no feature columns"),
    ("npz_complex", "npz", _npz({"X": np.array([[1 + 1j]]), "y": np.array([1.0])}), {}, "X must be real numbers"),
    ("npz_strings", "npz", _npz({"X": np.array([["a"]]), "y": np.array([1.0])}), {}, "X must be real numbers"),
    # 3-D and 4-D X are images (flattened per row); 1-D and 5-D are refused
    ("npz_1d", "npz", _npz({"X": np.zeros(3), "y": np.array([1.0])}), {}, "X must be 2-D"),
    ("npz_5d", "npz", _npz({"X": np.zeros((1, 1, 1, 1, 1)), "y": np.array([1.0])}), {}, "X must be 2-D"),
    ("npz_y_mismatch", "npz", _npz({"X": np.zeros((2, 1)), "y": np.array([1.0])}), {}, "y must have shape (2,)"),
    ("npz_missing_y", "npz", _npz({"X": np.zeros((2, 1))}), {}, "array 'y' not in the .npz"),
    ("npz_pickled_objects", "npz", _npz_pickled(), {}, "object arrays are refused"),
    ("npz_lying_header", "npz", _npz_lying_header(), {}, "its arrays declare"),
    ("npz_multiclass_huge", "npz", _npz({"X": np.zeros((2, 1)), "y": np.array([0, 10**12])}), {"task": "multiclass"},
     "at most 10,000 classes"),
    ("npz_n_classes_array", "npz", _npz({"X": np.zeros((2, 1)), "y": np.array([0, 1]), "n_classes": np.array([2, 3])}),
     {"task": "multiclass"}, "n_classes must be one integer"),
    ("npz_gzip_bomb", "npz", gzip.compress(_npz({"X": np.zeros((1 << 17, 2)), "y": np.ones(1 << 17)}), 9),
     {"max_bytes": 1 << 20}, "decompresses to more than max_bytes"),
]


def test_the_data_corpus_is_large() -> None:
    assert len(CASES) >= 55 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("name", "fmt", "content", "kw", "fragment"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_data_file_is_refused_naming_the_place(tmp_path: Path, name: str, fmt: str, content: bytes, kw: dict,
                                                     fragment: str) -> None:
    path = tmp_path / f"{name}.{fmt}"
    path.write_bytes(content)
    args = {"task": "binary", "label": "y", **kw}
    t0 = time.monotonic()
    with pytest.raises(DataError) as err:
        load_file(fmt, path, **args)
    message = str(err.value)
    assert message.startswith(f"{path}"), message[:300]  # the file is named first
    assert fragment in message, message[:300]
    assert len(message) < 1000, len(message)  # an oversized cell is not echoed whole
    assert time.monotonic() - t0 < 60


def test_good_files_of_each_format_still_load(tmp_path: Path) -> None:
    """The control: the loaders accept a well-formed file of each format, inside the range."""
    (tmp_path / "d.csv").write_text("a,b,y\n0.5,0.25,1\n0.1,0.9,0\n")
    (tmp_path / "d.svm").write_text("1 1:0.5 2:0.25\n-1 2:0.9\n")
    (tmp_path / "d.npz").write_bytes(_npz({"X": np.array([[0.5, 0.25], [0.1, 0.9]]), "y": np.array([1.0, -1.0])}))
    (tmp_path / "d.csv.gz").write_bytes(gzip.compress(b"a,b,y\n0.5,0.25,1\n0.1,0.9,0\n"))
    for fmt, name in [("csv", "d.csv"), ("libsvm", "d.svm"), ("npz", "d.npz"), ("csv", "d.csv.gz")]:
        ds = load_file(fmt, tmp_path / name, task="binary", label="y", feature_range=(0.0, 1.0))
        assert ds.n == 2 and ds.d == 2 and sorted(ds.y.tolist()) == [-1.0, 1.0], name


def test_the_party_config_refuses_a_file_over_max_bytes_before_reading(tmp_path: Path) -> None:
    """A 1 GiB (sparse) data file named in a party config stops the daemon at start-up, from its size."""
    from parties.config import ConfigError, load_party_config

    (tmp_path / "pki").mkdir()
    for f in ("alice.crt", "alice.key", "ca.crt"):
        (tmp_path / "pki" / f).write_text("x")
    with open(tmp_path / "rows.csv", "wb") as f:
        f.truncate(GIB)
    text = ('listen = "127.0.0.1:7101"\n[identity]\nname = "alice"\ncert = "pki/alice.crt"\nkey = "pki/alice.key"\n'
            'ca = "pki/ca.crt"\n[datasets.claims]\nformat = "csv"\npath = "rows.csv"\nlabel = "y"\nepsilon = 1.0\n'
            'delta = 0.0\n{extra}[policy]\nallowed_coordinators = ["coordinator"]\nmax_epsilon_per_job = 1.0\n'
            'max_iterations = 10\n')
    (tmp_path / "party.toml").write_text(text.format(extra=""))
    with pytest.raises(ConfigError, match=r"datasets\.claims\.path: .*rows\.csv is 1,073,741,824 bytes, larger "
                                          r"than max_bytes \(536,870,912\)"):
        load_party_config(tmp_path / "party.toml")
    (tmp_path / "party.toml").write_text(text.format(extra="max_bytes = 2147483648\n"))
    cfg = load_party_config(tmp_path / "party.toml")  # raised deliberately: accepted
    assert cfg.datasets["claims"].max_bytes == 2 * GIB


# --------------------------------------------------------------------------- gigabyte files, peak memory

_PROBE = """
import json, resource, sys, time
from mpc_erm.data import DataError
from mpc_erm.data.loaders import load_file
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.monotonic()
try:
    ds = load_file(sys.argv[1], sys.argv[2], task="binary", label="y", max_bytes=int(sys.argv[3]))
    out = {"loaded": True, "n": ds.n, "d": ds.d}
except DataError as e:
    out = {"loaded": False, "error": str(e)}
out.update(seconds=time.monotonic() - t0, base_kib=base, peak_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
print(json.dumps(out))
"""


def measure(fmt: str, path: Path, max_bytes: int = 512 << 20) -> dict:
    """load_file in a fresh process: its outcome, seconds and peak RSS (KiB, getrusage ru_maxrss)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", _PROBE, fmt, str(path), str(max_bytes)], capture_output=True,
                         env=env, timeout=900)
    assert res.returncode == 0, res.stderr.decode()[-2000:]  # an OOM kill would be -9 here
    return json.loads(res.stdout.decode().splitlines()[-1])


def test_a_1_gib_file_is_refused_before_reading(tmp_path: Path) -> None:
    """Sparse, so it costs no disk: the loader refuses it from its size without reading a byte."""
    path = tmp_path / "huge.csv"
    with open(path, "wb") as f:
        f.truncate(GIB + 1)
    try:
        for fmt in ("csv", "libsvm", "npz"):
            got = measure(fmt, path)
            assert not got["loaded"] and "larger than max_bytes=536,870,912" in got["error"], got
            assert got["seconds"] < 1.0, got
            assert got["peak_kib"] - got["base_kib"] < 50 * 1024, got  # nothing of the file in memory
            print(f"1 GiB sparse {fmt}: refused in {got['seconds'] * 1e3:.1f} ms, peak RSS "
                  f"{got['peak_kib'] / 1024:.0f} MiB (+{(got['peak_kib'] - got['base_kib']) / 1024:.1f} MiB)")
    finally:
        path.unlink()


def _gzip_members(path: Path, first: bytes, body: bytes, total: int) -> None:
    """A gzip file of ``total`` decompressed bytes from repeated members (one compression of ``body``)."""
    member = gzip.compress(body, 6)
    with open(path, "wb") as f:
        f.write(gzip.compress(first, 6))
        for _ in range(-(-(total - len(first)) // len(body))):
            f.write(member)


@pytest.mark.slow
def test_a_gzip_bomb_of_over_1_gib_is_refused_in_constant_memory(tmp_path: Path) -> None:
    """~5 MB on disk, 1.06 GiB inflated: refused in the counting pass, before pandas sees a byte."""
    path = tmp_path / "bomb.csv.gz"
    _gzip_members(path, b"a,b,y\n", b"0.5,0.25,1\n" * (6 << 20), GIB + (64 << 20))
    try:
        got = measure("csv", path)
        assert not got["loaded"] and "decompresses to more than max_bytes=536,870,912" in got["error"], got
        assert got["peak_kib"] - got["base_kib"] < 100 * 1024, got
        print(f"gzip bomb {path.stat().st_size / 1e6:.1f} MB -> 1.06 GiB: refused in {got['seconds']:.1f} s, "
              f"peak RSS {got['peak_kib'] / 1024:.0f} MiB (+{(got['peak_kib'] - got['base_kib']) / 1024:.1f} MiB)")
    finally:
        path.unlink()


@pytest.mark.slow
def test_a_1_gib_generated_csv_is_refused_and_a_64_mib_one_is_read_in_bounded_memory(tmp_path: Path) -> None:
    """A real (not sparse) 1 GiB CSV: refused from its size. A real 64 MiB one: read, with peak RSS a
    small multiple of the file (the dense matrix and the labels), not of anything the file claims."""
    path = tmp_path / "real.csv"
    row = b"0.5,0.25,0.125,1\n"
    with open(path, "wb") as f:
        f.write(b"a,b,c,y\n")
        block = row * (1 << 16)
        while f.tell() < GIB + 1:
            f.write(block)
    try:
        got = measure("csv", path)
        assert not got["loaded"] and "larger than max_bytes" in got["error"] and got["seconds"] < 1.0, got
        print(f"1 GiB real csv: refused in {got['seconds'] * 1e3:.1f} ms, peak RSS {got['peak_kib'] / 1024:.0f} MiB")
        size = 8 + ((64 << 20) - 8) // len(row) * len(row)  # 64 MiB, cut at a row boundary
        with open(path, "r+b") as f:
            f.truncate(size)
        got = measure("csv", path)
        assert got["loaded"] and got["n"] == (size - 8) // len(row) and got["d"] == 3, got
        growth = (got["peak_kib"] - got["base_kib"]) * 1024
        assert growth < 8 * size, got
        print(f"64 MiB real csv ({got['n']:,} rows): read in {got['seconds']:.1f} s, peak RSS "
              f"{got['peak_kib'] / 1024:.0f} MiB (+{growth / 2**20:.0f} MiB = {growth / size:.1f}x the file)")
    finally:
        path.unlink()


# --------------------------------------------------------------------------- the worker, end to end


@pytest.mark.slow
def test_a_real_worker_refuses_a_bad_csv_and_the_budget_is_released(tmp_path: Path) -> None:
    """``mpc-erm party serve`` with a CSV data set holding a NaN; a job on it runs the real
    ``parties.worker``: the job fails with a code and a public reason, the file, column and row are
    in the party's own log (issue 13: not in what leaves it), and its reservation is released (no ε
    spent). It fails at step 1 (load rows), before any peer is contacted."""
    import grpc

    from mpc_erm.mpc import pki, tls
    from mpc_erm.mpc._proto import party_pb2 as pb
    from mpc_erm.mpc._proto import party_pb2_grpc as pb_grpc
    from parties.ledger import Ledger

    ca = pki.create_ca("data CA")
    for name, role in [("alice", "party"), ("bob", "party"), ("carol", "party"), ("coordinator", "coordinator")]:
        pki.save_identity(pki.issue_identity(ca, name, role), tmp_path / "pki")  # type: ignore[arg-type]
    rows = "a,b,y\n" + "".join(f"{i / 100},{(i % 7) / 10},{i % 2}\n" for i in range(40)) + "0.3,nan,1\n"
    (tmp_path / "rows.csv").write_text(rows)
    p = tmp_path / "pki"
    (tmp_path / "party.toml").write_text(
        f'listen = "127.0.0.1:0"\nstate_dir = "state"\ndevice = "cpu"\nthreads = 1\n\n[identity]\nname = "alice"\n'
        f'cert = "{p / "alice.crt"}"\nkey = "{p / "alice.key"}"\nca = "{p / "ca.crt"}"\n\n'
        '[peers.bob]\naddress = "127.0.0.1:9"\nrole = "party"\n\n[peers.carol]\naddress = "127.0.0.1:9"\n'
        'role = "party"\n\n[datasets.claims]\nformat = "csv"\npath = "rows.csv"\nlabel = "y"\nepsilon = 3.0\n'
        'delta = 1e-4\nfeature_range = [0.0, 1.0]\n\n[policy]\nallowed_coordinators = ["coordinator"]\n'
        "max_epsilon_per_job = 1.0\nmax_iterations = 50\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with open(tmp_path / "daemon.err", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "party", "serve", "--config",
                                 str(tmp_path / "party.toml")], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        assert proc.stdout is not None
        port = json.loads(proc.stdout.readline())["port"]
        channel = tls.secure_channel(f"127.0.0.1:{port}", pki.load_identity(tmp_path / "pki", "coordinator"), "alice")
        stub = pb_grpc.PartyControlStub(channel)
        job = ('method = "output"\n\n[job]\nname = "bad-data"\ndataset = "claims"\n'
               'parties = ["alice", "bob", "carol"]\ntrust = "replicated"\n\n[privacy]\nepsilon = 0.5\n'
               'delta = 1e-5\nmechanism = "gaussian"\n')
        reply = stub.SubmitJob(pb.SubmitRequest(job_id="baddata", job_toml=job), timeout=120)
        assert reply.accepted
        info = wait_for(lambda: (i := stub.GetStatus(pb.JobRef(job_id="baddata"), timeout=30)).status
                        in ("failed", "succeeded", "cancelled") and i, 300, "the job to end", every=0.2)
        assert info.status == "failed", info  # type: ignore[union-attr]
        reason = info.reason  # type: ignore[union-attr]
        assert reason.startswith("DATA_SCHEMA: data set 'claims' failed its schema check at party alice; see that "
                                 "party's log"), reason
        assert "rows.csv" not in reason and "row 41" not in reason, reason
        log = (tmp_path / "state" / "daemon.log").read_text()
        assert "rows.csv" in log and "column 'b' at row 41" in log, log[-2000:]
        channel.close()
    except grpc.RpcError as exc:
        raise AssertionError(f"{exc}; daemon log: {(tmp_path / 'daemon.err').read_text()[-2000:]}") from None
    finally:
        stop_process_group(proc, 30)
    with Ledger(tmp_path / "state" / "ledger.sqlite3") as led:
        assert led.get("baddata").state == "released"
        assert led.show()[0].epsilon_spent == 0.0
