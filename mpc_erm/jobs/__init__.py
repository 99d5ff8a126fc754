"""What a job is, below the daemons and the coordinator that both use it.

- :mod:`.jobfile`: the job file a user submits (``[job]`` table + training spec), validated
  strictly; its digest is what every party agrees on before the MPC starts;
- :mod:`.toml_reader`: the one strict TOML reader (size, UTF-8, syntax, nesting, field names) of
  job files and daemon configs;
- :mod:`.status`: :class:`JobStatus`, the states a job goes through, and which are terminal.

The job file names are re-exported here but imported only when first used: the job file pulls in
the training spec (and torch), which the TOML reader and the status enum must not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mpc_erm.lazy_exports import lazy_exports

from .status import LIVE, TERMINAL, JobStatus

if TYPE_CHECKING:
    from .jobfile import (
        MAX_JOB_FILE_BYTES,
        MAX_PARTIES,
        MIN_PARTIES,
        Device,
        JobFile,
        JobFileError,
        JobTable,
        Trust,
        load_job_file,
        parse_job_file,
    )

__all__ = ["LIVE", "MAX_JOB_FILE_BYTES", "MAX_PARTIES", "MIN_PARTIES", "TERMINAL", "Device", "JobFile", "JobFileError",
           "JobStatus", "JobTable", "Trust", "load_job_file", "parse_job_file"]
_JOBFILE = frozenset(__all__) - {"LIVE", "TERMINAL", "JobStatus"}

__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(_JOBFILE, "jobfile"), globals())
