"""Secrets out of anything printed: the one redaction helper every output path uses.

A password travels inside URLs more often than anywhere else (``postgresql+psycopg://app:pw@db/
lora``, ``redis://default:pw@valkey:6379/0``, ``?password=`` query parameters), and those URLs
are config values, so they reach start-up logs, ``kvstack config show``, error messages and,
as backend ids, metric labels. Every one of those paths runs its text through
:func:`redact_text` (or a URL through :func:`redact_url`): the password becomes ``***``, the
rest (scheme, user, host, path) stays, because that is what an operator needs to debug.
Pydantic's ``SecretStr`` values already dump as ``**********``; :func:`redact_data` covers the
plain strings around them.

Where it is applied: :class:`kvstack.errors.KVStackError` (every message), the log formatter
of :func:`kvstack.log.setup_logging` (every record, tracebacks included),
:func:`kvstack.section.log_config_once` and ``kvstack config show`` (every string of the
dump), and static backend ids (metric labels). A leaf: it imports nothing of kvstack.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MASK", "redact_data", "redact_text", "redact_url"]

MASK = "***"

# scheme://[user]:password@ — the authority ends at the first '/', '?', '#', blank or quote;
# the greedy run backtracks to the authority's last '@' (a password may hold an encoded '@').
_USERINFO = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/?#@\s'\"<>]*):(?P<password>[^/?#\s'\"<>]*)@"
)
# Query parameters that carry a credential (``password_env`` names a variable: not a secret).
_SECRET_PARAMS = (
    "password|passwd|pwd|pass|secret|token|api_key|apikey|access_token|auth_token|"
    "secret_key|aws_secret_access_key|x-amz-signature|x-amz-security-token|x-amz-credential"
)
_QUERY = re.compile(rf"(?P<name>[?&;](?:{_SECRET_PARAMS})=)(?P<value>[^&;#\s'\"<>]*)", re.I)


def redact_text(text: str) -> str:
    """``text`` with every password in a URL (userinfo or a credential query parameter)
    replaced by ``***``; text without one is returned as is."""
    if "://" not in text and "=" not in text:
        return text  # the common case: nothing that could hold a URL credential
    text = _USERINFO.sub(_mask_userinfo, text)
    return _QUERY.sub(lambda m: m.group("name") + (MASK if m.group("value") else ""), text)


def redact_url(url: str) -> str:
    """One URL with its password masked (``redis://u:***@h:6379/0``)."""
    return redact_text(url)


def redact_data(value: Any) -> Any:
    """A JSON-like structure (a config dump) with every string run through :func:`redact_text`."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {key: redact_data(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact_data(item) for item in value]
    return value


def _mask_userinfo(match: re.Match[str]) -> str:
    if not match.group("password"):
        return match.group(0)  # "user:@host": nothing to hide
    return f"{match.group('scheme')}{match.group('user')}:{MASK}@"
