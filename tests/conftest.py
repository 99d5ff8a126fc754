"""Project-wide test hooks: the ``data`` marker (pyproject: "needs ../shared/data") skips, with
the reason, wherever the real data sets are absent; ``data_dir`` is their root. Under pytest-xdist
the longest files are handed out first (see :data:`FILE_SECONDS`), and each worker's math
libraries use its share of the cores (see :func:`_share_the_cores`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _share_the_cores() -> None:
    """At an xdist worker, OpenMP/BLAS (torch, numpy) and every process the tests start use
    cores // workers threads (1 on the 2-core CI machine), unless OMP_NUM_THREADS is set. Each
    library otherwise starts a thread per core in every worker: on 2 cores with 2 workers (and
    the daemons the tests start) the threads of a parallel region wait on each other, and a
    torch-heavy test ran 2-20 times longer than on one thread. Set before torch is imported (it
    reads the variables when it loads); numpy's BLAS, loaded already, is limited in place."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers or "OMP_NUM_THREADS" in os.environ:
        return
    share = str(max(1, len(os.sched_getaffinity(0)) // int(workers)))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, share)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - scikit-learn's dependency
        return
    threadpool_limits(int(share))


_share_the_cores()

from mpc_erm.data.sets import _repo_default_root, data_root_or_none  # noqa: E402


def _start_the_fork_server() -> None:
    """At an xdist worker, start this process's fork server (Python's, process-wide: the first
    start chooses what it imports) with what every test's children need: the job workers' modules
    (``tests.procs.PRELOAD``: torch, CrypTen, the job code) and the stand-in worker of
    tests/parties/test_daemon.py. Otherwise the first in-process daemon of a stand-in test
    started it with its own two modules, and every later child of the worker's other files (MPC
    harnesses, job workers) imported torch and CrypTen for itself: 5-6 s of CPU each, which made
    a file's time depend on the files run before it (tests/parties/test_worker.py: 50 s or 120 s)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from multiprocessing import forkserver

    from mpc_erm.mpc.local import forkserver_context
    from tests.procs import PRELOAD

    forkserver_context((*PRELOAD, "tests.parties.test_daemon"))
    forkserver.ensure_running()  # it imports in the background; a child's start waits for it

_ROOT = data_root_or_none()
_SKIP_REASON = f"real data sets absent: set $MPC_ERM_DATA or provide {_repo_default_root()}"


#: About how long each of the longest files of `make test` and `make test-long` takes on the 2-core CI machine
#: (seconds: setup + call + teardown of its tests, from ``--durations=0``). With ``--dist loadfile``
#: (``make test``) a file runs whole on one worker, and the workers take the files in the order
#: collected; these are put first, longest first, so that no long file starts near the end while
#: the other worker runs out of work (the wall time is then about the sum over the workers). Only
#: the order depends on these figures, never what runs: a stale one costs balance, nothing else.
FILE_SECONDS = {
    "tests/parties/test_owner_jobs.py": 80,
    "tests/parties/test_owner_faults.py": 80,
    "tests/parties/test_hostile_owners.py": 160,
    "tests/parties/test_hostile_party.py": 35,
    "tests/mpc/test_validation.py": 30,
    "tests/mpc/test_agreement.py": 60,
    "tests/parties/test_deviating_party.py": 300,
    "tests/reliability/test_leaks.py": 55,
    "tests/reliability/test_owner_leaks.py": 55,
    "tests/reliability/test_faults.py": 50,
    "tests/test_bench_cli.py": 50,
    "tests/reliability/test_network_faults.py": 45,
    "tests/coordinator/test_walkthrough.py": 45,
    "tests/reliability/test_disk_full.py": 45,
    "tests/reliability/test_error_boundary.py": 40,
    "tests/reliability/test_concurrency.py": 40,
    "tests/parties/test_network_daemons.py": 40,
    "tests/parties/test_end_to_end.py": 35,
    "tests/reliability/test_two_phase_admission.py": 35,
    "tests/parties/test_multihost.py": 35,
    "tests/parties/test_regression_job.py": 30,
    "tests/parties/test_worker.py": 25,
    "tests/simulate/test_cli.py": 20,
    "tests/reliability/test_worker_stall.py": 20,
    "tests/mpc/test_owner_intake.py": 20,
    "tests/privacy/test_uniform_owner_sampling.py": 20,
    "tests/mpc/test_samplers.py": 20,
    "tests/parties/test_serve_errors.py": 15,
    "tests/parties/test_schema_jobs.py": 15,
    "tests/parties/test_daemon.py": 15,
    "tests/mpc/test_dealer.py": 15,
}


def pytest_configure(config: pytest.Config) -> None:
    """``--dist loadfile`` hands out the files in the collected order (:data:`FILE_SECONDS`), not
    xdist's default of the files with the most tests first (that put the long end-to-end files,
    one or two tests each, last)."""
    if config.getoption("dist", "no") == "loadfile" and not hasattr(config, "workerinput"):
        config.option.loadscopereorder = False
    _start_the_fork_server()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip every @pytest.mark.data test, with the reason, when shared/data is missing; at an xdist
    worker, order the files longest first (:data:`FILE_SECONDS`; the others keep their order)."""
    if hasattr(config, "workerinput"):
        def file_of(item: pytest.Item) -> str:
            return item.nodeid.split("::", 1)[0]

        first = {f: i for i, f in enumerate(dict.fromkeys(map(file_of, items)))}
        items.sort(key=lambda item: (-FILE_SECONDS.get(file_of(item), 0), first[file_of(item)]))
    if _ROOT is not None:
        return
    skip = pytest.mark.skip(reason=_SKIP_REASON)
    for item in items:
        if item.get_closest_marker("data") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if _ROOT is None:
        pytest.skip(_SKIP_REASON)
    return _ROOT
