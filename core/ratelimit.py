"""Per-identity request rate limiting: one token bucket per caller, kept in Redis.

Called once per authenticated request by the gRPC interceptor
(`xmc.auth.grpc.AuthInterceptor`, answering RESOURCE_EXHAUSTED) and the DRF
throttle (`xmc.auth.drf.IdentityRateThrottle`, answering 429). Both share the
bucket of an identity, so a client cannot double its budget by switching
protocol, and every web/gRPC process shares it through Redis.

Why it exists: the real client's list loops never stop paging by themselves
(the real xmanager client's behaviour, tests/system/real_client), so one script can send thousands of calls
a second. The bucket holds ``XMC_RATE_LIMIT_BURST`` tokens and refills at
``XMC_RATE_LIMIT_PER_S``; each request takes one.

A Redis round trip is a Lua script (sent once, then called by SHA) that reads
the bucket, refills it by the time elapsed on the *Redis server's* clock (so
hosts with skewed clocks agree), takes tokens if there are any and writes it
back, atomically. A process does not make one per request: it takes a small
*lease* of tokens out of the shared bucket (at most the bucket's refill in
``LEASE_S``, 0.1 s, and a tenth of the burst; one token when the rate is low)
and spends it locally for at most ``LEASE_S``. Leased tokens have left the
shared bucket, so the processes together never admit more than it holds;
tokens a lease did not spend in time are dropped, which only makes the limit
stricter, by at most one lease per process and identity. At the default
50/s that is 5 tokens per lease; at 1/s and below it is exact per request. If Redis cannot be reached the limiter lets requests through
(availability of the API matters more than the limit), logs once per outage,
and does not try Redis again for a few seconds so a dead Redis costs nothing on
the happy path.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import redis
from django.conf import settings

logger = logging.getLogger(__name__)

KEY_PREFIX = "xmc:ratelimit:v1:"

# KEYS[1] bucket hash {t: tokens, ts: last refill, seconds}; ARGV: rate/s, burst, tokens wanted.
# Takes as many of the wanted tokens as the bucket has whole (none if it has
# less than one). Returns {tokens taken, milliseconds until one is available}.
_TOKEN_BUCKET_LUA = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 't', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then
  tokens = burst
  ts = now
end
if now > ts then
  tokens = math.min(burst, tokens + (now - ts) * rate)
end
local taken = 0
local wait_ms = 0
if tokens >= 1 then
  taken = math.min(want, math.floor(tokens))
  tokens = tokens - taken
else
  wait_ms = math.ceil((1 - tokens) / rate * 1000)
end
redis.call('HSET', KEYS[1], 't', string.format('%.6f', tokens), 'ts', string.format('%.6f', now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return {taken, wait_ms}
"""

#: How long a process may spend the tokens it leased, and how much refill one lease may take.
LEASE_S = 0.1


@dataclass(frozen=True)
class RateDecision:
    """The answer for one request.

    ``retry_after_s`` is how long until the request would be allowed (0 when
    allowed); ``degraded`` is True when Redis was unreachable and the request
    was let through unmetered.
    """

    allowed: bool
    retry_after_s: float = 0.0
    degraded: bool = False


class RateLimiter:
    """A token bucket per key (an identity's email), shared through Redis.

    Thread-safe: the Redis client pools connections per process, and the
    outage bookkeeping tolerates racing threads (worst case two log lines).
    ``rate_per_s <= 0`` or ``burst <= 0`` disables limiting.
    """

    def __init__(
        self,
        redis_url: str,
        rate_per_s: float,
        burst: int,
        *,
        socket_timeout_s: float = 0.25,
        outage_backoff_s: float = 5.0,
    ) -> None:
        self.rate_per_s = float(rate_per_s)
        self.burst = int(burst)
        self.enabled = self.rate_per_s > 0 and self.burst > 0
        self._outage_backoff_s = outage_backoff_s
        self._client = redis.Redis.from_url(
            redis_url,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_timeout_s,
        )
        self._script = self._client.register_script(_TOKEN_BUCKET_LUA)
        #: Tokens per lease: the refill of LEASE_S, at most a tenth of the burst, at least one.
        self.lease_size = max(1, min(int(self.rate_per_s * LEASE_S), self.burst // 10)) if self.enabled else 0
        #: Per key: [tokens left in this process's lease, monotonic time it lapses].
        self._leases: dict[str, list[float]] = {}
        self._skip_redis_until = 0.0
        self._in_outage = False
        self._lock = threading.Lock()

    def check(self, key: str) -> RateDecision:
        """Take one token of ``key``'s bucket: from this process's lease, else from Redis."""
        if not self.enabled:
            return RateDecision(allowed=True)
        now = time.monotonic()
        if self.lease_size > 1:
            with self._lock:
                lease = self._leases.get(key)
                if lease is not None and lease[0] >= 1 and now < lease[1]:
                    lease[0] -= 1
                    return RateDecision(allowed=True)
        if self._in_outage and now < self._skip_redis_until:
            return RateDecision(allowed=True, degraded=True)
        try:
            taken, wait_ms = self._script(keys=[KEY_PREFIX + key], args=[self.rate_per_s, self.burst, self.lease_size])
        except (redis.RedisError, OSError) as exc:
            self._enter_outage(exc)
            return RateDecision(allowed=True, degraded=True)
        if self._in_outage:
            self._leave_outage()
        if int(taken) < 1:
            return RateDecision(allowed=False, retry_after_s=max(int(wait_ms), 1) / 1000.0)
        if self.lease_size > 1:
            with self._lock:
                if len(self._leases) > 10_000:  # forget lapsed leases of callers gone quiet
                    self._leases = {k: v for k, v in self._leases.items() if v[1] > now}
                lease = self._leases.get(key)
                if lease is not None and now < lease[1]:  # threads that ran out together: pool what they took
                    lease[0] += int(taken) - 1
                else:
                    self._leases[key] = [int(taken) - 1, now + LEASE_S]
        return RateDecision(allowed=True)

    def reset(self, key: str) -> None:
        """Forget ``key``'s bucket and this process's lease of it (tests and operators)."""
        with self._lock:
            self._leases.pop(key, None)
        self._client.delete(KEY_PREFIX + key)

    def _enter_outage(self, exc: BaseException) -> None:
        with self._lock:
            self._skip_redis_until = time.monotonic() + self._outage_backoff_s
            if not self._in_outage:
                self._in_outage = True
                logger.warning(
                    "ratelimit.redis_unavailable: allowing requests unmetered until Redis answers",
                    extra={"error": f"{type(exc).__name__}: {exc}"},
                )

    def _leave_outage(self) -> None:
        with self._lock:
            if self._in_outage:
                self._in_outage = False
                logger.info("ratelimit.redis_recovered: metering requests again")


_limiters: dict[tuple[str, float, int], RateLimiter] = {}
_limiter_lock = threading.Lock()


def limiter_for(rate_per_s: float, burst: int) -> RateLimiter:
    """The process-wide limiter of this rate and burst on the configured Redis (one per setting: a
    new one when the settings change, as tests do)."""
    config = (settings.REDIS_URL, float(rate_per_s), int(burst))
    limiter = _limiters.get(config)
    if limiter is not None:
        return limiter
    with _limiter_lock:
        if config not in _limiters:
            if len(_limiters) > 16:  # settings changed many times (tests): drop the stale ones
                _limiters.clear()
            _limiters[config] = RateLimiter(*config)
        return _limiters[config]


def get_rate_limiter() -> RateLimiter:
    """The API's limiter: ``XMC_RATE_LIMIT_PER_S`` / ``XMC_RATE_LIMIT_BURST`` per identity."""
    return limiter_for(settings.XMC_RATE_LIMIT_PER_S, settings.XMC_RATE_LIMIT_BURST)


def check_rate(identity_key: str) -> RateDecision:
    """Meter one request of the identity ``identity_key`` (its lower-cased email)."""
    return get_rate_limiter().check(identity_key)

