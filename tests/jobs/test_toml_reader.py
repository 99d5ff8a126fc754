"""The one strict TOML reader (mpc_erm.jobs.toml_reader): every failure is a TomlProblem naming
the field (or the file), and job files and daemon configs report the same problem the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpc_erm.jobs import JobFileError, load_job_file, parse_job_file
from mpc_erm.jobs.toml_reader import MAX_DEPTH, TomlProblem, parse_toml, read_toml_file, too_deep
from parties.config import ConfigError, load_party_config


def problem(fn, *args, **kw) -> TomlProblem:
    with pytest.raises(TomlProblem) as info:
        fn(*args, **kw)
    return info.value


def test_valid_text_parses() -> None:
    assert parse_toml('a = 1\n[t]\nb = [1, [2]]\n') == {"a": 1, "t": {"b": [1, [2]]}}


@pytest.mark.parametrize(("text", "field", "fragment"), [
    ("a = \n", None, "invalid TOML: "),
    ("a = " + "[" * 3000 + "]" * 3000 + "\n", None, "nested too deeply"),
    ("a = " + "9" * 5000 + "\n", None, "a number at line 1 is too long"),
    ("x" * 2000, "", "2,000 bytes, larger than the limit of 1,000"),
    ("a.b.c.d.e.f.g.h.i.j = 1\n", "a.b.c.d.e.f.g.h.i", f"nested more than {MAX_DEPTH} levels deep"),
    ("[t]\nk = [[[[[[[[1]]]]]]]]\n", "t.k[0][0][0][0][0][0][0]", "nested more than"),
])
def test_text_problems_name_the_field(text: str, field: str | None, fragment: str) -> None:
    p = problem(parse_toml, text, max_bytes=1000 if len(text) == 2000 else 1 << 20)
    assert p.field == field and fragment in p.reason, (p.field, p.reason)


def test_syntax_errors_quote_the_line() -> None:
    p = problem(parse_toml, 'ok = 1\nepsilon = = 2\n')
    assert "line 2" in p.reason and "'epsilon = = 2'" in p.reason


def test_hostile_keys_are_quoted_and_cut() -> None:
    raw = {"a\nb": {"x" * 500: [[[[[[[[[1]]]]]]]]]}}
    path = too_deep(raw)
    assert path is not None and "\n" not in path and len(path) < 150


def test_file_problems(tmp_path: Path) -> None:
    missing = problem(read_toml_file, tmp_path / "nope.toml")
    assert missing.field is None and missing.reason == "cannot read: No such file or directory"
    assert problem(read_toml_file, tmp_path).reason.startswith("cannot read")  # a directory: EISDIR
    assert problem(read_toml_file, "/dev/zero").reason == "not a regular file"  # read nothing of it
    big = tmp_path / "big.toml"
    big.write_text("x = 1\n" * 400)
    assert problem(read_toml_file, big, max_bytes=1000).reason == "2,400 bytes, larger than the limit of 1,000"
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"a = 1\n\xff")
    p = problem(read_toml_file, binary)
    assert p.field == "" and p.reason.startswith("not UTF-8 text") and "0xff at line 2" in p.reason


def test_job_files_and_configs_report_one_problem_alike(tmp_path: Path) -> None:
    """The same defect reads the same after the file name, whichever loader met it."""
    deep = tmp_path / "deep.toml"
    deep.write_text("a.b.c.d.e.f.g.h.i = 1\n")
    with pytest.raises(JobFileError) as job:
        load_job_file(deep)
    with pytest.raises(ConfigError) as cfg:
        load_party_config(deep)
    assert str(job.value) == str(cfg.value) == f"{deep}: a.b.c.d.e.f.g.h.i: nested more than 8 levels deep"
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff")
    with pytest.raises(JobFileError) as job:
        load_job_file(binary)
    with pytest.raises(ConfigError) as cfg:
        load_party_config(binary)
    assert str(job.value) == str(cfg.value).replace(f"{binary}: ", f"{binary}: (file): ")
    with pytest.raises(JobFileError, match=r"^<job>: invalid TOML: "):
        parse_job_file("method = [")
