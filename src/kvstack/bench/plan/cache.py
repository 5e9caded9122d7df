"""How often an LRU cache still holds a reused prefix: Che's approximation.

A cache of ``C`` tokens takes in ``U`` tokens per second that are never reused (the unique
parts of prompts, generated tokens) and serves ``G`` prefixes of ``s`` tokens, each asked for
as a Poisson stream of rate ``lambda``. Under LRU every entry stays for about the same
*characteristic time* ``T`` after its last use, the one at which the cache is exactly full::

    U x T + G x s x (1 - exp(-lambda x T)) = C

and a prefix is still there when asked for again with probability ``1 - exp(-lambda x T)``
(Che, Tung and Wang, 2002; accurate for LRU with many items). A cache that never fills keeps
everything (``T`` infinite); one of no capacity keeps nothing.
"""

from __future__ import annotations

import math
from typing import NamedTuple

__all__ = ["PrefixStream", "characteristic_time_s", "hit_probability"]


class PrefixStream(NamedTuple):
    """What one cache sees: its unique inflow, and the reused prefixes it serves."""

    inflow_tokens_per_s: float
    num_prefixes: float
    prefix_tokens: float
    rate_per_prefix: float  # requests per second for each prefix, at this cache


def _occupied(stream: PrefixStream, time_s: float) -> float:
    reused = stream.num_prefixes * stream.prefix_tokens
    return stream.inflow_tokens_per_s * time_s + reused * -math.expm1(
        -stream.rate_per_prefix * time_s
    )


def characteristic_time_s(capacity_tokens: float, stream: PrefixStream) -> float:
    """``T`` of the equation above; ``inf`` when the cache never fills."""
    if capacity_tokens <= 0:
        return 0.0
    reused = stream.num_prefixes * stream.prefix_tokens
    if stream.inflow_tokens_per_s <= 0 and (reused <= capacity_tokens or
                                             stream.rate_per_prefix <= 0):  # fmt: skip
        return math.inf
    high = 1.0
    while _occupied(stream, high) < capacity_tokens:
        high *= 2
        if high > 1e15:
            return math.inf
    low = 0.0
    for _ in range(100):  # bisection: the left side grows with T
        mid = (low + high) / 2
        if _occupied(stream, mid) < capacity_tokens:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def hit_probability(capacity_tokens: float, stream: PrefixStream) -> float:
    """The chance a reused prefix is still cached when it is asked for again."""
    if stream.rate_per_prefix <= 0 or stream.prefix_tokens <= 0:
        return 0.0
    time_s = characteristic_time_s(capacity_tokens, stream)
    if math.isinf(time_s):
        return 1.0
    return -math.expm1(-stream.rate_per_prefix * time_s)
