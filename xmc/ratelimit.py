"""Per-identity request rate limiting: one token bucket per caller, kept in Redis.

Called once per authenticated request by the gRPC interceptor
(`xmc.auth.grpc.AuthInterceptor`, answering RESOURCE_EXHAUSTED) and the DRF
throttle (`xmc.auth.drf.IdentityRateThrottle`, answering 429). Both share the
bucket of an identity, so a client cannot double its budget by switching
protocol, and every web/gRPC process shares it through Redis.

Why it exists: the real client's list loops never stop paging by themselves
(the real xmanager client's behaviour, tests/real_client), so one script can send thousands of calls
a second. The bucket holds ``XMC_RATE_LIMIT_BURST`` tokens and refills at
``XMC_RATE_LIMIT_PER_S``; each request takes one.

A check is one Redis round trip: a Lua script (sent once, then called by SHA)
reads the bucket, refills it by the time elapsed on the *Redis server's* clock
(so hosts with skewed clocks agree), takes a token if there is one and writes it
back, atomically. If Redis cannot be reached the limiter lets requests through
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

# KEYS[1] bucket hash {t: tokens, ts: last refill, seconds}; ARGV: rate/s, burst, cost.
# Returns {allowed 0|1, milliseconds until `cost` tokens are available}.
_TOKEN_BUCKET_LUA = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
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
local allowed = 0
local wait_ms = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  wait_ms = math.ceil((cost - tokens) / rate * 1000)
end
redis.call('HSET', KEYS[1], 't', string.format('%.6f', tokens), 'ts', string.format('%.6f', now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return {allowed, wait_ms}
"""


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
        self._skip_redis_until = 0.0
        self._in_outage = False
        self._lock = threading.Lock()

    def check(self, key: str, cost: int = 1) -> RateDecision:
        """Take ``cost`` tokens from ``key``'s bucket if it has them."""
        if not self.enabled:
            return RateDecision(allowed=True)
        if self._in_outage and time.monotonic() < self._skip_redis_until:
            return RateDecision(allowed=True, degraded=True)
        try:
            allowed, wait_ms = self._script(keys=[KEY_PREFIX + key], args=[self.rate_per_s, self.burst, cost])
        except (redis.RedisError, OSError) as exc:
            self._enter_outage(exc)
            return RateDecision(allowed=True, degraded=True)
        if self._in_outage:
            self._leave_outage()
        if int(allowed) == 1:
            return RateDecision(allowed=True)
        return RateDecision(allowed=False, retry_after_s=max(int(wait_ms), 1) / 1000.0)

    def reset(self, key: str) -> None:
        """Forget ``key``'s bucket (tests and operators)."""
        self._client.delete(KEY_PREFIX + key)

    def _enter_outage(self, exc: BaseException) -> None:
        with self._lock:
            self._skip_redis_until = time.monotonic() + self._outage_backoff_s
            if not self._in_outage:
                self._in_outage = True
                logger.warning(
                    "ratelimit.redis_unavailable: allowing requests unmetered until Redis answers (%s: %s)",
                    type(exc).__name__,
                    exc,
                )

    def _leave_outage(self) -> None:
        with self._lock:
            if self._in_outage:
                self._in_outage = False
                logger.info("ratelimit.redis_recovered: metering requests again")


_limiter: RateLimiter | None = None
_limiter_config: tuple[str, float, int] | None = None
_limiter_lock = threading.Lock()


def get_rate_limiter() -> RateLimiter:
    """The process-wide limiter for the current settings (rebuilt when they change)."""
    global _limiter, _limiter_config
    config = (settings.REDIS_URL, float(settings.XMC_RATE_LIMIT_PER_S), int(settings.XMC_RATE_LIMIT_BURST))
    limiter = _limiter
    if limiter is not None and _limiter_config == config:
        return limiter
    with _limiter_lock:
        if _limiter is None or _limiter_config != config:
            _limiter = RateLimiter(*config)
            _limiter_config = config
        return _limiter


def check_rate(identity_key: str) -> RateDecision:
    """Meter one request of the identity ``identity_key`` (its lower-cased email)."""
    return get_rate_limiter().check(identity_key)

