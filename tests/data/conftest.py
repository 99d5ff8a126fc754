"""Fixtures for the data-layer tests: a private cache (the data root and the ``data`` marker's
skip are project-wide: ``tests/conftest.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def kdd_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh cache directory for the session, so cache timings are measured, not inherited."""
    return tmp_path_factory.mktemp("mpc_erm_cache")
