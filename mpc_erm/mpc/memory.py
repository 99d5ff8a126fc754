"""Process memory settings for MPC party processes.

Why: glibc gives every thread that allocates its own malloc arena (up to 8 per core). In a party,
gRPC's threads receive the share messages (MiB each) and the main thread frees them, so freed
blocks sit in arenas that the allocating threads rarely reuse: a Gaussian noise batch of 2^17
samples left ≈ 310 MB of extra resident memory per party with default arenas, ≈ 200 MB with two
(``python -m benchmarks aggregate --streamed --dim 100000 --rounds 10``), at the same speed;
forcing mmap for every large block cut it further but halved the sampler's speed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

__all__ = ["MALLOC_ARENAS", "limit_malloc_arenas"]

log = logging.getLogger(__name__)

MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # glibc <malloc.h>


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas for this process (call early, before threads start); False where
    the C library is not glibc (nothing to do there)."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = bool(mallopt(ctypes.c_int(_M_ARENA_MAX), ctypes.c_int(arenas)))
    if not ok:
        log.debug("mallopt(M_ARENA_MAX) refused")
    return ok
