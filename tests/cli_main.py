"""Run `mpc-erm ...` in process through the real ``main()``: its error mapping and exit codes,
without the seconds an interpreter start costs."""

from __future__ import annotations

import sys

import pytest


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `mpc-erm ARGS`."""
    from coordinator.cli import main

    monkeypatch.setattr(sys, "argv", ["mpc-erm", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
