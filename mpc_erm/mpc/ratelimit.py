"""Per-peer call rate limits for the gRPC services (party control and share transport).

Why per peer: every caller is an authenticated certificate identity (mutual TLS), so the identity
is the natural key. One runaway or hostile peer (a bug looping on GetStatus, a member flooding
a mailbox with tiny messages) then exhausts only its own bucket and gets RESOURCE_EXHAUSTED with
a message naming it and the limit, while every other peer, and the job, carry on.

A token bucket per key: ``burst`` tokens, refilled at ``rate_per_s``; a call costs one token.
The check is a lock and a few float operations (well under a microsecond of work against the
tens of microseconds of a gRPC call). The number of buckets is bounded: idle buckets (full
again) carry no state worth keeping and are dropped when the table grows past ``max_keys``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

__all__ = ["CONTROL_DEFAULT", "TRANSPORT_DEFAULT", "LogThrottle", "RateLimit", "RateLimiter"]


@dataclass(frozen=True)
class RateLimit:
    """``rate_per_s`` calls per second sustained, ``burst`` calls at once, per peer identity."""

    rate_per_s: float
    burst: float

    def __post_init__(self) -> None:
        if not (self.rate_per_s > 0 and self.burst >= 1):
            raise ValueError(f"rate limit needs rate_per_s > 0 and burst >= 1, got {self.rate_per_s}, {self.burst}")

    def __str__(self) -> str:
        return f"{self.rate_per_s:g} calls/s (burst {self.burst:g})"


# Defaults, far above legitimate use. Control: the coordinator client watches jobs over streams
# (one call each) and a job's workers look up endpoints a few times; a script polling GetStatus
# at 20 Hz for ten jobs at once is still under 200/s. Transport: a CrypTen job measured at
# 50-125 messages/s per peer (3 parties, dealer or replicated, loaded 2-core machine), and one
# peer's 8 sender threads cannot push more than a few thousand unary calls per second through
# Python gRPC; 20 000/s (burst 50 000) leaves an order of magnitude on a fast machine too.
CONTROL_DEFAULT = RateLimit(rate_per_s=200.0, burst=2000.0)
TRANSPORT_DEFAULT = RateLimit(rate_per_s=20_000.0, burst=50_000.0)


class RateLimiter:
    """Token buckets keyed by peer identity; thread-safe.

    ``take(key)`` returns 0.0 when the call may proceed, else the seconds until a token is back
    (what the refusal message reports). ``should_log(key)`` throttles the refusal log to one
    line per peer per ``log_every_s`` so that a flood cannot turn into a flood of log lines.
    """

    def __init__(
        self,
        limit: RateLimit,
        *,
        max_keys: int = 4096,
        log_every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.max_keys = max_keys
        self.log_every_s = log_every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[Hashable, list[float]] = {}  # key -> [tokens, last refill time]
        self._logged: dict[Hashable, tuple[float, int]] = {}  # key -> (last log time, suppressed)

    def take(self, key: Hashable, cost: float = 1.0) -> float:
        rate, burst = self.limit.rate_per_s, self.limit.burst
        now = self._clock()
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= self.max_keys:
                    self._prune(now)
                bucket = self._buckets[key] = [burst, now]
            tokens = min(burst, bucket[0] + (now - bucket[1]) * rate)
            bucket[1] = now
            if tokens >= cost:
                bucket[0] = tokens - cost
                return 0.0
            bucket[0] = tokens
            return (cost - tokens) / rate

    def _prune(self, now: float) -> None:
        """Drop buckets that refilled completely (equivalent to a fresh one); else the oldest half."""
        rate, burst = self.limit.rate_per_s, self.limit.burst
        full = [k for k, (tok, last) in self._buckets.items() if tok + (now - last) * rate >= burst]
        for k in full:
            del self._buckets[k]
        if len(self._buckets) >= self.max_keys:
            oldest = sorted(self._buckets, key=lambda k: self._buckets[k][1])[: self.max_keys // 2]
            for k in oldest:
                del self._buckets[k]

    def should_log(self, key: Hashable) -> tuple[bool, int]:
        """(log this refusal?, refusals suppressed since the last logged one)."""
        now = self._clock()
        with self._lock:
            last, suppressed = self._logged.get(key, (float("-inf"), 0))
            if now - last >= self.log_every_s:
                if len(self._logged) >= self.max_keys:
                    self._logged.clear()
                self._logged[key] = (now, 0)
                return True, suppressed
            self._logged[key] = (last, suppressed + 1)
            return False, suppressed + 1


class LogThrottle:
    """At most ``limit`` log lines per key (a token bucket); what it drops is counted and reported
    with the key's next line. Why: every refusal is logged, and without this a peer could turn
    its refused calls (cheap for it) into a flood of log lines (disk, log shipping) for us."""

    def __init__(self, limit: RateLimit = RateLimit(rate_per_s=5.0, burst=50.0)) -> None:
        self._bucket = RateLimiter(limit)
        self._lock = threading.Lock()
        self._dropped: dict[Hashable, int] = {}

    def allow(self, key: Hashable) -> tuple[bool, int]:
        """(log this line?, lines of this key dropped since its last logged one)."""
        ok = self._bucket.take(key) == 0.0
        with self._lock:
            if not ok:
                if len(self._dropped) >= self._bucket.max_keys:
                    self._dropped.clear()
                self._dropped[key] = self._dropped.get(key, 0) + 1
                return False, 0
            return True, self._dropped.pop(key, 0)
