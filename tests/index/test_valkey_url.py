"""Valkey index URLs: topology, login, TLS and index settings are read; mistakes are one clear
error with the password masked."""

from __future__ import annotations

import re

import pytest

from kvstack.errors import ConfigError
from kvstack.index.backend import backend_name
from kvstack.index.urls import check_index_url, redact_url
from kvstack.index.valkey.url import parse_valkey_url


def test_standalone_defaults() -> None:
    o = parse_valkey_url("redis://10.0.0.5:6380/2")
    assert (o.seeds, o.db, o.cluster, o.sentinel, o.tls) == (
        [("10.0.0.5", 6380)],
        2,
        False,
        "",
        False,
    )
    assert (o.prefix, o.buckets, o.instance_ttl_s) == ("kvstack:index:", 1, 30.0)


def test_cluster_sentinel_login_and_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = parse_valkey_url("redis://a:7000,b:7001?cluster=true&prefix=fleet1:")
    assert cluster.cluster and cluster.buckets == 16 and cluster.prefix == "fleet1:"
    monkeypatch.setenv("IDX_PW", "s3cret")
    monkeypatch.setenv("SENT_PW", "other")
    url = ("rediss://kvstack@s1:26379,s2:26379/0?sentinel=main&password_env=IDX_PW"
           "&sentinel_password_env=SENT_PW&ssl_ca_certs=/ca.pem&instance_ttl_s=10")  # fmt: skip
    o = parse_valkey_url(url)
    login = (o.username, o.password, o.sentinel_password, o.sentinel)
    assert login == ("kvstack", "s3cret", "other", "main")
    assert o.tls and o.ssl == {"ssl_ca_certs": "/ca.pem", "ssl_cert_reqs": "required"}
    assert o.instance_ttl_s == 10.0 and "s3cret" not in repr(o)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis://h:6379?colour=red", "unknown parameter(s) colour"),
        ("redis://h:6379?ssl_ca_certs=/ca.pem", "need a rediss:// URL"),
        ("redis://h:6379/1?cluster=true", "only database 0"),
        ("redis://h:6379?buckets=0", "buckets='0'"),
        ("redis://h:6379?prefix={x}", "without braces"),
        ("redis://h:99999", "bad port"),
        ("redis://h:6379?password_env=NOT_SET_ANYWHERE", "$NOT_SET_ANYWHERE"),
        ("redis://h:6379?instance_ttl_s=-1", "positive number"),
    ],
)
def test_mistakes_are_named(url: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(problem)):
        parse_valkey_url(url)


def test_passwords_never_appear_in_errors() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_valkey_url("redis://user:hunter2@h:6379?colour=red")
    assert "hunter2" not in str(caught.value) and "user:***@h:6379" in str(caught.value)
    with pytest.raises(ConfigError) as bad_scheme:
        check_index_url("memcached://user:hunter2@h:1")
    assert "hunter2" not in str(bad_scheme.value)
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"


def test_the_scheme_picks_the_backend() -> None:
    assert backend_name("redis://h:6379") == backend_name("rediss://h:6379") == "valkey"
    assert {backend_name(u) for u in ("http://h:1", "https://h:1", "zmq://h:2")} == {"service"}
