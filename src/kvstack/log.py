"""Process-level logging setup for the ``kvstack`` command; every line it writes is redacted."""

from __future__ import annotations

import logging
import os

from kvstack.redact import redact_text

__all__ = ["IncidentLogger", "RedactingFilter", "setup_logging"]

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class RedactingFilter(logging.Filter):
    """A handler filter after which a record shows no URL password: its message (with its
    arguments merged in) and its traceback go through :func:`kvstack.redact.redact_text`, so
    a third-party library logging a connection URL is covered too."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        return True


def setup_logging(level: str | None = None) -> None:
    """Log to stderr at ``level`` (``KVSTACK_LOG_LEVEL``, else INFO); every handler of the root
    logger gets a :class:`RedactingFilter`."""
    level = (level or os.environ.get("KVSTACK_LOG_LEVEL") or "INFO").upper()
    logging.basicConfig(level=level, format=_FORMAT, datefmt="%H:%M:%S")
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
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
