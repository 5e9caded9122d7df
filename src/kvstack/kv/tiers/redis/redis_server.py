"""How to run ``redis-server`` for KV chunks: keep freed reply memory for the next reply.

A ``GET`` of a 32 MiB value makes Redis copy the value into a 32 MiB reply buffer, which it
frees once sent. jemalloc (Redis's allocator) hands such freed pages back to the kernel
soon after, so the next reply faults every page in again: on a 2-core VM, page faults
were a seventh of the server's time and stock Redis served batched reads at about half of
loopback TCP. With ``dirty_decay_ms:-1`` jemalloc keeps those pages for reuse and the same
reads ran 1.5x faster (``kvstack bench shared`` measures both). The cost: the server's
resident memory stays at its peak (``maxmemory`` plus the largest burst of replies) instead
of shrinking after bursts; ``MEMORY PURGE`` returns it on demand.

The setting is an environment variable read by jemalloc at start: ``MALLOC_CONF`` for the
system jemalloc of Debian's and most distributions' packages, ``JE_MALLOC_CONF`` for Redis
and Valkey built from source with their bundled, prefixed jemalloc. A server built with
libc malloc ignores both. ``kvstack up`` starts its redis-server with this environment.
"""

from __future__ import annotations

import os

__all__ = ["LARGE_VALUE_MALLOC_CONF", "large_value_env"]

LARGE_VALUE_MALLOC_CONF = "dirty_decay_ms:-1"
_VARIABLES = ("MALLOC_CONF", "JE_MALLOC_CONF")


def large_value_env() -> dict[str, str]:
    """The variables to start redis-server with; one already set in this environment wins."""
    return {name: os.environ.get(name, LARGE_VALUE_MALLOC_CONF) for name in _VARIABLES}
