"""Child processes for tests, started the way a daemon starts its workers: forked from a fork
server that has already imported torch, CrypTen and the job code (``parties.supervision``'s
preload), instead of spawned.

Why: a spawned child imports all of that again, 5–6 s of CPU each, and the default suite starts
over a hundred such children (three parties per MPC test, four members per worker test); on CI's
two cores that import time was a fifth of the suite. The fork server only imports modules (it
never initialises CrypTen), so each child starts from pristine module state, as a worker does.

One fork server per test process (Python's, process-wide): the first call starts it, with the
environment of that moment; a child that needs an environment variable set later must be given
it explicitly.
"""

from __future__ import annotations

from typing import Any

from mpc_erm.mpc.local import forkserver_context
from parties.supervision import WORKER_PRELOAD

#: What the fork server imports: the daemon's own list (a daemon run in this process asks for the
#: same one, so whichever starts the server first, both find what they expect).
PRELOAD = ("parties.daemon", "parties.worker", *WORKER_PRELOAD)


def preloaded_context() -> Any:
    """A multiprocessing context whose children fork from the preloaded fork server."""
    return forkserver_context(PRELOAD)
