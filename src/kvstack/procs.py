"""Process helpers shared by the stack supervisor, the file tier and the serving processes."""

from __future__ import annotations

import gc
import os

__all__ = ["pid_alive", "tune_gc"]


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (one of another user's counts as alive)."""
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tune_gc() -> None:
    """Collect young objects 30x less often, and exempt the startup heap from collections.

    A proxied request allocates a few hundred container objects (scope, headers, futures,
    coroutines), nearly all freed by reference counting; with the default threshold (700) a
    generation-0 collection ran every two or three requests and cost ~20 µs of the ~75 µs the
    router's own code spends per request (measured with the router's ASGI app in process).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 100)
