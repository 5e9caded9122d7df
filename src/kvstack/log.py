"""Process-level logging setup for the ``kvstack`` command."""

from __future__ import annotations

import logging
import os

__all__ = ["setup_logging"]


def setup_logging(level: str | None = None) -> None:
    level = (level or os.environ.get("KVSTACK_LOG_LEVEL") or "INFO").upper()
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if logging.getLevelName(level) != logging.DEBUG:
        # httpx logs every request at INFO: health checks, index calls and adapter loads
        # would flood the log of a busy router.
        logging.getLogger("httpx").setLevel(logging.WARNING)


class IncidentLogger:
    """Logs a recurring failure once per incident: the first occurrence, then at most once per
    ``interval_s`` with the number of occurrences suppressed in between. Thread-safe enough:
    a lost increment under a race only changes a logged count."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0) -> None:
        self._logger = logger
        self._interval_s = interval_s
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, kind: str, msg: str, *args: object) -> None:
        import time

        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self._interval_s:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return
        self._last[kind] = now
        suppressed = self._suppressed.pop(kind, 0)
        if suppressed:
            msg += " (%d similar failures since the last report)"
            args = (*args, suppressed)
        self._logger.warning(msg, *args)
