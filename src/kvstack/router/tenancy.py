"""Tenants isolated by construction: cache salts, priority caps and what a caller may see.

Every request of an authenticated tenant carries a ``cache_salt`` the router derives, whatever
the client sent::

    cache_salt = hex(BLAKE2b-128(key = K, namespace ‖ client salt))    (length-prefixed parts)
    namespace  = "ns:" + router.tenants.<tenant>.kv_namespace   when configured,
                 "tenant:" + tenant                               otherwise

The salt reaches the engines in vLLM's ``cache_salt`` field, which keys vLLM's block hashes
(the prefix cache), the kvstack connector's chunk namespace (every tier) and the KV events the
router indexes; the router's own prefix index keys by it too (it reads the forwarded body). So
two tenants never share KV, and routing credit never crosses from one to the other, unless
``kv_namespace`` names the same namespace for both. A client's own salt subdivides its
tenant's namespace, never escapes it: it is an input of the MAC, not the salt. The result is 32
hex characters, inside vLLM's rules (at most 128 characters, no ``@ / \\`` or NUL).

The key ``K`` is the cluster secret's ``tenant-salt`` key (:mod:`kvstack.security`), so every
router of a cluster derives the same salts and salts survive restarts. Without a cluster
secret, ``K`` is 32 random bytes drawn at start and never stored: still unguessable (a salt
cannot be forged from outside, even by someone who reaches an engine directly), at the price
that a restart or a second router gives every tenant a fresh namespace, so its earlier KV is
a miss (never a leak). Rotating the cluster secret has the same price. Callers without an API
key (auth off) belong to no tenant: their client salt, if any, goes to the engine unchanged.

Priorities: ``x-kvstack-priority`` above the tenant's ``max_priority`` (for callers without a
tenant, and tenants not listed, ``router.default_max_priority``: ``standard``) is lowered to
it, so ``critical``, which skips admission and shedding, is granted per tenant, never asked.

Engine controls: vLLM takes a request's ``kv_transfer_params`` as orders for the engine's KV
connector (kvstack's per-request load mode, which may make a load stall every request stepping
beside it; a P/D connector's remote host and port, which the engine then connects to). A caller
without the admin key has its field dropped, on every JSON route, unless
``router.client_kv_transfer_params`` opens it to all.

Privilege: a caller sending the admin key in ``x-kvstack-admin-key`` (``router.auth.admin_key``
or ``lora.admin_key``), or any caller with ``router.debug_headers``, sees the full
``x-kvstack-decision`` header; everyone else sees the backend and the reason only.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from kvstack.errors import RequestError
from kvstack.router.admission.config import PRIORITIES
from kvstack.router.config import RouterConfig
from kvstack.router.request import ADMIN_HEADER, GENERATION_ENDPOINTS, RoutingRequest, encode_body
from kvstack.section import load_section
from kvstack.security import ClusterKeys, SecurityConfig, load_keys

__all__ = ["ENGINE_CONTROLS", "SALT_FORBIDDEN", "Tenancy", "TenantView", "check_client_salt"]

log = logging.getLogger(__name__)
SALT_FORBIDDEN = frozenset("@/\\\x00")  # vLLM's validate_cache_salt
MAX_SALT_CHARS = 128
_SALT_CACHE = 4096  # (tenant, client salt) pairs remembered
_RANK: dict[str, int] = {p: i for i, p in enumerate(PRIORITIES)}  # 0: critical, the highest
ENGINE_CONTROLS = "kv_transfer_params"  # a body field only the admin key may send (see above)
_CONTROLS_RAW = b'"kv_transfer_params"'  # as a key in the raw body (a quote inside a string
# is escaped, so the unescaped form is a key, or a whole string value: a needless re-encode)


class TenantView(NamedTuple):
    """A request's fields as the tenancy leaves them."""

    body: dict[str, Any]
    priority: str | None
    privileged: bool


class Tenancy:
    """``keys``: the cluster keys (None: a random per-process salt key, see the module doc);
    ``admin_keys``: the keys ``x-kvstack-admin-key`` may carry."""

    def __init__(
        self, config: RouterConfig, keys: ClusterKeys | None, admin_keys: Sequence[str] = ()
    ) -> None:
        self.config = config
        if keys is None:
            self._salt_key = os.urandom(32)
            log.info(
                "no cluster secret: tenant cache salts use a key of this process only; after "
                "a restart (or on another router) tenants start with an empty KV namespace"
            )
        else:
            self._salt_key = keys.key("tenant-salt")
        self._admin = [hashlib.sha256(k.encode()).digest() for k in admin_keys if k]
        self._salts: dict[tuple[str, str | None], str] = {}
        self._dropped_logged = False

    @classmethod
    def from_environment(
        cls, config: RouterConfig, extra_admin_keys: Sequence[str] = (), path: str | None = None
    ) -> Tenancy:
        """Keys from the ``security`` section (the config file ``path``, else
        ``KVSTACK_CONFIG``, then ``KVSTACK_SECURITY_*``); the admin keys:
        ``router.auth.admin_key`` and ``extra_admin_keys`` (``lora.admin_key``)."""
        keys = load_keys(load_section("security", SecurityConfig, path=path))
        admin = config.auth.admin_key
        own = [] if admin is None else [admin.get_secret_value()]
        return cls(config, keys, [*own, *extra_admin_keys])

    def adjust(
        self,
        body: dict[str, Any],
        headers: Mapping[str, str],
        tenant: str | None,
        priority: str | None,
        salted: bool = True,
    ) -> TenantView:
        """What the router makes of a request while it is parsed (one object is built, no
        copy): privilege decided, priority capped, and for a tenant the derived
        ``cache_salt`` in the body (``salted``: the generation routes, whose prompts vLLM
        caches)."""
        privileged = self.config.debug_headers or self._is_admin(headers)
        if tenant is not None and salted:
            salt = self.salt(tenant, check_client_salt(body.get("cache_salt")))
            body = {**body, "cache_salt": salt}
        return TenantView(body, self.capped_priority(tenant, priority), privileged)

    def engine_fields(self, body: dict[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
        """A JSON body without the caller's ``kv_transfer_params``, unless it may send them
        (``body`` itself when there is nothing to drop)."""
        if ENGINE_CONTROLS not in body:
            return body
        if self.config.client_kv_transfer_params or self._is_admin(headers):
            return body
        if not self._dropped_logged:
            self._dropped_logged = True
            log.warning(
                "a caller without the admin key sent kv_transfer_params: dropped (set "
                "router.client_kv_transfer_params to forward every caller's; logged once)"
            )
        return {k: v for k, v in body.items() if k != ENGINE_CONTROLS}

    @staticmethod
    def forwarded_body(request: RoutingRequest, raw: bytes) -> bytes:
        """The bytes to forward: the client's own, unless the tenancy rewrote the body (a
        tenant's request: its salt; a dropped ``kv_transfer_params``). Without a client salt
        the field is spliced in front of the client's bytes instead of re-encoding the body:
        one copy instead of an encode (a 100 KB prompt costs ~10 µs to copy, several times
        that to encode)."""
        if _CONTROLS_RAW in raw and ENGINE_CONTROLS not in request.body and _is_json(raw):
            return encode_body(request.body)  # the field was dropped
        if request.tenant is None or request.endpoint not in GENERATION_ENDPOINTS:
            return raw
        head = raw.lstrip()
        if b'"cache_salt"' in raw or not head.startswith(b"{"):
            return encode_body(request.body)  # the client's field is replaced
        field = b'"cache_salt":"' + str(request.body["cache_salt"]).encode() + b'"'
        rest = head[1:].lstrip()
        return b"{" + field + (b"" if rest.startswith(b"}") else b",") + rest

    def salt(self, tenant: str, client_salt: str | None) -> str:
        """The cache salt of ``tenant``'s requests carrying ``client_salt`` (memoized,
        bounded: client salts are the client's to vary)."""
        key = (tenant, client_salt)
        found = self._salts.get(key)
        if found is None:
            if len(self._salts) >= _SALT_CACHE:
                self._salts.clear()
            found = self._salts[key] = self._derive(tenant, client_salt)
        return found

    def _derive(self, tenant: str, client_salt: str | None) -> str:
        digest = hashlib.blake2b(key=self._salt_key, digest_size=16, person=b"kvstack-salt")
        for part in (self.namespace(tenant), client_salt or ""):
            raw = part.encode()
            digest.update(len(raw).to_bytes(8, "little"))
            digest.update(raw)
        return digest.hexdigest()

    def namespace(self, tenant: str) -> str:
        """The KV namespace of ``tenant``: shared when configured, its own otherwise."""
        entry = self.config.tenants.get(tenant)
        if entry is not None and entry.kv_namespace is not None:
            return f"ns:{entry.kv_namespace}"
        return f"tenant:{tenant}"

    def capped_priority(self, tenant: str | None, asked: str | None) -> str | None:
        """``asked`` lowered to the tenant's highest priority; unknown values pass (admission
        answers them with a 400)."""
        if asked not in _RANK:
            return asked
        highest = self.max_priority(tenant)
        return highest if _RANK[asked] < _RANK[highest] else asked

    def max_priority(self, tenant: str | None) -> str:
        entry = self.config.tenants.get(tenant) if tenant is not None else None
        return entry.max_priority if entry is not None else self.config.default_max_priority

    def _is_admin(self, headers: Mapping[str, str]) -> bool:
        given = headers.get(ADMIN_HEADER)
        if not given or not self._admin:
            return False
        digest = hashlib.sha256(given.encode()).digest()
        return any(hmac.compare_digest(digest, key) for key in self._admin)


def _is_json(raw: bytes) -> bool:
    """A JSON object's bytes (not a form's: its fields are the client's own)."""
    return raw.lstrip()[:1] == b"{"


def check_client_salt(salt: object) -> str | None:
    """A client's ``cache_salt``, checked as vLLM checks it (a clear 400 rather than a salt
    the engine would refuse once the router had rewritten it)."""
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        raise RequestError(
            "Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt"
        )
    if len(salt) > MAX_SALT_CHARS or any(c in SALT_FORBIDDEN for c in salt):
        raise RequestError(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', "
            "'/', '\\\\', or NUL.",
            param="cache_salt",
        )
    return salt
