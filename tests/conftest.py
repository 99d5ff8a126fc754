"""Project-wide test hooks: the ``data`` marker (pyproject: "needs ../shared/data") skips, with
the reason, wherever the real data sets are absent; ``data_dir`` is their root."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpc_erm.data.sets import _repo_default_root, data_root_or_none

_ROOT = data_root_or_none()
_SKIP_REASON = f"real data sets absent: set $MPC_ERM_DATA or provide {_repo_default_root()}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip every @pytest.mark.data test, with the reason, when shared/data is missing."""
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
