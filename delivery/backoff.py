"""The one backoff of every retry that crosses the broker: exponential, with "equal jitter"."""
from __future__ import annotations

import random


def jittered(attempt: int, *, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Uniform in [c/2, c], c = min(cap, base * 2**attempt); ``attempt`` counts from 0.

    The jitter (AWS Architecture Blog, "Exponential Backoff And Jitter",
    https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/)
    spreads the retries of many tasks that failed together; the lower half
    keeps a minimum wait so a retry never comes back at once.
    """
    ceiling = min(cap, base * (2 ** max(0, attempt)))
    return (rng or random).uniform(ceiling / 2, ceiling)
