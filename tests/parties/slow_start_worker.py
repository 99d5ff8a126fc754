"""The stand-in worker of tests/parties/test_daemon.py behind an import that takes SLOW_IMPORT_S.

The daemon's worker pool (its fork server) imports the worker module before it forks any worker:
with this module, that start-up work lasts long enough for the readiness tests to watch a daemon
that answers but does not take jobs yet (the real worker's imports take as long on a cold disk)."""

from __future__ import annotations

import time

SLOW_IMPORT_S = 4.0

time.sleep(SLOW_IMPORT_S)

from tests.parties.test_daemon import run_dealer_job, run_party_job  # noqa: E402

__all__ = ["SLOW_IMPORT_S", "run_dealer_job", "run_party_job"]
