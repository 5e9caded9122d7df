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
    tenant: str | None,
    body: bytes = b'{"model":"m","prompt":"x"}',
    tenancy: Tenancy | None = None,
    **headers: str,
) -> RoutingRequest:
    """``body`` parsed as the router parses it, through ``tenancy`` (default: one on KEYS)."""
    chosen = Tenancy(CONFIG, KEYS) if tenancy is None else tenancy
    return parse_request("completions", body, headers, tenant=tenant, tenancy=chosen)


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


def test_the_body_of_tenant_requests_only_is_rewritten() -> None:
    t = Tenancy(CONFIG, KEYS)
    raw = b'{"model":"m","prompt":"x","cache_salt":"mine"}'
    applied = request("a", raw, tenancy=t)
    body = Tenancy.forwarded_body(applied, raw)
    assert applied.body["cache_salt"] == t.salt("a", "mine") and b"mine" not in body
    anonymous = request(None, raw, tenancy=t)
    assert Tenancy.forwarded_body(anonymous, raw) is raw
    assert anonymous.body["cache_salt"] == "mine"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model":"m","prompt":"x"}',
        b'  \n {  "model" : "m", "prompt": "say \\"cache_salt\\"" }',
        b'{"model":"m","prompt":"x","cache_salt":"mine"}',
        b'{"cache_salt":"mine","model":"m","prompt":"x","response_format":{"cache_salt":1}}',
    ],
)
def test_the_forwarded_body_is_the_rewritten_one_however_the_client_wrote_it(raw: bytes) -> None:
    import json

    applied = request("a", raw)
    forwarded = Tenancy.forwarded_body(applied, raw)
    assert json.loads(forwarded) == applied.body
    assert forwarded.count(b'"cache_salt":"') == 1  # one salt field, the derived one


@pytest.mark.parametrize("bad", ['""', '"a/b"', '"x@y"', '"' + "z" * 129 + '"', "7"])
def test_a_client_salt_vllm_would_refuse_is_a_clear_400(bad: str) -> None:
    raw = b'{"model":"m","prompt":"x","cache_salt":' + bad.encode() + b"}"
    with pytest.raises(RequestError, match="cache_salt") as refused:
        request("a", raw)
    assert refused.value.status == 400 and refused.value.param == "cache_salt"


def test_priorities_above_the_tenants_highest_are_lowered() -> None:
    critical = {"x-kvstack-priority": "critical"}
    assert request("vip", **critical).priority == "critical"
    assert request("a", **critical).priority == "standard"
    assert request(None, **critical).priority == "standard"
    assert request(None, **{"x-kvstack-priority": "sheddable"}).priority == "sheddable"
    assert request(None).priority is None
    bogus = {"x-kvstack-priority": "urgent"}  # refused under every admission
    with pytest.raises(RequestError, match="critical, standard, sheddable") as refused:
        request("a", **bogus)
    assert refused.value.status == 400 and refused.value.code == "invalid_priority"
    opened = Tenancy(CONFIG.model_copy(update={"default_max_priority": "critical"}), KEYS)
    assert request(None, tenancy=opened, **critical).priority == "critical"


def test_only_the_admin_key_or_debug_headers_make_a_caller_privileged() -> None:
    t = Tenancy.from_environment(CONFIG)
    assert not request("a", tenancy=t).privileged
    assert not request("a", tenancy=t, **{"x-kvstack-admin-key": "guess"}).privileged
    assert request("a", tenancy=t, **{"x-kvstack-admin-key": "the-admin-key"}).privileged
    lora_key = Tenancy(CONFIG, KEYS, ["lora-admin"])
    assert request(None, tenancy=lora_key, **{"x-kvstack-admin-key": "lora-admin"}).privileged
    debug = Tenancy(CONFIG.model_copy(update={"debug_headers": True}), KEYS)
    assert request("a", tenancy=debug).privileged


ORDERS = {"kvstack": {"load_mode": "sync"}}


@pytest.mark.parametrize("tenant", [None, "a"])
def test_a_callers_kv_transfer_params_reach_the_engine_only_with_the_admin_key(
    tenant: str | None,
) -> None:
    import json

    t = Tenancy(CONFIG, KEYS, admin_keys=["the-admin-key"])
    raw = json.dumps({"model": "m", "prompt": "x", "kv_transfer_params": ORDERS}).encode()
    caller = request(tenant, raw, tenancy=t)
    forwarded = json.loads(Tenancy.forwarded_body(caller, raw))
    assert "kv_transfer_params" not in caller.body and "kv_transfer_params" not in forwarded
    assert forwarded["prompt"] == "x"
    admin = request(tenant, raw, tenancy=t, **{"x-kvstack-admin-key": "the-admin-key"})
    assert json.loads(Tenancy.forwarded_body(admin, raw))["kv_transfer_params"] == ORDERS
    opened = Tenancy(CONFIG.model_copy(update={"client_kv_transfer_params": True}), KEYS)
    forwarded = Tenancy.forwarded_body(request(tenant, raw, tenancy=opened), raw)
    assert json.loads(forwarded)["kv_transfer_params"] == ORDERS
    # A body that only mentions the name is forwarded as the client wrote it.
    words = b'{"model":"m","prompt":"what are \\"kv_transfer_params\\"?"}'
    assert Tenancy.forwarded_body(request(None, words, tenancy=t), words) is words


def test_a_form_body_naming_the_field_is_forwarded_untouched() -> None:
    from kvstack.router.http.parse import parse_form_request

    raw = (
        b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nm\r\n'
        b'--b\r\nContent-Disposition: form-data; name="kv_transfer_params"\r\n\r\n{}\r\n--b--\r\n'
    )
    headers = {"content-type": "multipart/form-data; boundary=b"}
    parsed = parse_form_request(raw, headers, route_path="/v1/audio/transcriptions",
                                tenancy=Tenancy(CONFIG, KEYS))  # fmt: skip
    assert Tenancy.forwarded_body(parsed, raw) is raw
