"""Tenancy's rules in isolation: derived salts, shared namespaces, priority caps, privilege."""

from __future__ import annotations

import pytest

from kvstack.errors import RequestError
from kvstack.router.config import RouterConfig
from kvstack.router.http.parse import parse_request
from kvstack.router.request import RoutingRequest
from kvstack.router.tenancy import SALT_FORBIDDEN, Tenancy
from kvstack.security import ClusterKeys

KEYS = ClusterKeys(b"s" * 32)
CONFIG = RouterConfig.model_validate(
    {
        "tenants": {
            "docs-a": {"kv_namespace": "shared-docs"},
            "docs-b": {"kv_namespace": "shared-docs"},
            "vip": {"max_priority": "critical"},
        },
        "auth": {"admin_key": "the-admin-key"},
    }
)


def request(
    tenant: str | None, body: bytes = b'{"model":"m","prompt":"x"}', **headers: str
) -> RoutingRequest:
    return parse_request("completions", body, headers, tenant=tenant)


def test_tenants_get_distinct_salts_and_a_shared_namespace_one_salt() -> None:
    t = Tenancy(CONFIG, KEYS)
    salts = {name: t.salt(name, None) for name in ("a", "b", "docs-a", "docs-b")}
    assert salts["a"] != salts["b"]
    assert salts["docs-a"] == salts["docs-b"] != salts["a"]
    # A tenant named like the namespace does not land in it.
    assert t.salt("shared-docs", None) != salts["docs-a"]
    for salt in salts.values():  # vLLM accepts it (<= 128 characters, no @ / \ NUL)
        assert len(salt) == 32 and not set(salt) & SALT_FORBIDDEN


def test_a_client_salt_subdivides_its_tenant_never_reaches_another() -> None:
    t = Tenancy(CONFIG, KEYS)
    assert t.salt("a", "doc-1") != t.salt("a", None)
    assert t.salt("a", "doc-1") != t.salt("b", "doc-1")
    # A tenant sending another tenant's derived salt as its own gets a third one.
    assert t.salt("b", t.salt("a", None)) != t.salt("a", None)


def test_salts_follow_the_cluster_secret_and_are_random_without_one() -> None:
    assert Tenancy(CONFIG, KEYS).salt("a", None) == Tenancy(CONFIG, KEYS).salt("a", None)
    other = ClusterKeys(b"t" * 32)
    assert Tenancy(CONFIG, other).salt("a", None) != Tenancy(CONFIG, KEYS).salt("a", None)
    assert Tenancy(CONFIG, None).salt("a", None) != Tenancy(CONFIG, None).salt("a", None)


def test_apply_rewrites_the_body_of_tenant_requests_only() -> None:
    t = Tenancy(CONFIG, KEYS)
    raw = b'{"model":"m","prompt":"x","cache_salt":"mine"}'
    applied, body = t.apply(request("a", raw), raw)
    assert applied.body["cache_salt"] == t.salt("a", "mine") and b"mine" not in body
    anonymous, same = t.apply(request(None, raw), raw)
    assert same is raw and anonymous.body["cache_salt"] == "mine"


@pytest.mark.parametrize("bad", ['""', '"a/b"', '"x@y"', '"' + "z" * 129 + '"', "7"])
def test_a_client_salt_vllm_would_refuse_is_a_clear_400(bad: str) -> None:
    raw = b'{"model":"m","prompt":"x","cache_salt":' + bad.encode() + b"}"
    with pytest.raises(RequestError, match="cache_salt") as refused:
        Tenancy(CONFIG, KEYS).apply(request("a", raw), raw)
    assert refused.value.status == 400 and refused.value.param == "cache_salt"


def test_priorities_above_the_tenants_highest_are_lowered() -> None:
    t = Tenancy(CONFIG, KEYS)
    critical = {"x-kvstack-priority": "critical"}
    assert t.apply(request("vip", **critical), b"")[0].priority == "critical"
    assert t.apply(request("a", **critical), b"")[0].priority == "standard"
    assert t.apply(request(None, **critical), b"")[0].priority == "standard"
    low = {"x-kvstack-priority": "sheddable"}
    assert t.apply(request(None, **low), b"")[0].priority == "sheddable"
    assert t.apply(request(None), b"")[0].priority is None
    bogus = {"x-kvstack-priority": "urgent"}  # left for admission to refuse with a 400
    assert t.apply(request("a", **bogus), b"")[0].priority == "urgent"
    opened = CONFIG.model_copy(update={"default_max_priority": "critical"})
    assert Tenancy(opened, KEYS).apply(request(None, **critical), b"")[0].priority == "critical"


def test_only_the_admin_key_or_debug_headers_make_a_caller_privileged() -> None:
    t = Tenancy.from_environment(CONFIG)
    assert not t.apply(request("a"), b"")[0].privileged
    wrong = {"x-kvstack-admin-key": "guess"}
    assert not t.apply(request("a", **wrong), b"")[0].privileged
    right = {"x-kvstack-admin-key": "the-admin-key"}
    assert t.apply(request("a", **right), b"")[0].privileged
    lora_key = Tenancy(CONFIG, KEYS, ["lora-admin"])
    assert lora_key.apply(request(None, **{"x-kvstack-admin-key": "lora-admin"}), b"")[0].privileged
    debug = Tenancy(CONFIG.model_copy(update={"debug_headers": True}), KEYS)
    assert debug.apply(request("a"), b"")[0].privileged
