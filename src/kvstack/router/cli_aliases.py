"""production-stack's router flags, accepted by ``kvstack router`` as aliases of its own.

A ``vllm-router`` command line from production-stack runs unchanged with ``kvstack router``::

    --service-discovery static|k8s     -> discovery.kind static | kubernetes
    --static-backends A,B              -> backends [{url: A}, {url: B}]
    --static-models M1,M2              -> each backend's models (the i-th for the i-th backend)
    --static-aliases ALIAS:MODEL,...   -> model_aliases
    --k8s-label-selector S             -> discovery.kubernetes.label_selector
    --routing-logic roundrobin         -> policy round_robin
                    session            -> policy session (with --session-key as its header)
                    prefixaware        -> policy prefix (prefix + load scores)
                    kvaware            -> policy ttft (cache-aware cost model; with --index-url,
                                          kvstack tier hits from the index server)
    --session-key H                    -> session_header H
    --engine-stats-interval S          -> scrape.interval_s S
    --max-instance-failover-reroute-attempts N -> retry.max_attempts N + 1
    --log-level L                      -> the log level

(``--k8s-namespace`` and ``--k8s-port`` are already kvstack's flags, with the same meaning.)
Flags that only tune production-stack's own statistics are accepted and ignored with a warning;
flags with no kvstack equivalent are errors that say what to use instead. ``docs/migrating.md``
has the table.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from kvstack.errors import ConfigError

__all__ = ["add_production_stack_flags", "production_stack_settings"]

log = logging.getLogger(__name__)

ROUTING_LOGIC = {
    "roundrobin": "round_robin",
    "session": "session",
    "prefixaware": "prefix",
    "kvaware": "ttft",
}
# Flags that tune production-stack's own request statistics and logs: nothing to map.
IGNORED = ("request_stats_window", "log_stats", "log_stats_interval")
# Flags with no equivalent, and what to use instead.
REFUSED = {
    "dynamic_config_json": "kvstack reads its config file at start (--config); the API keys "
    "file is re-read when it changes",
    "lmcache_controller_port": "kvstack's router asks kvstack's index server: pass --index-url",
    "callbacks": "kvstack has no request callbacks; its plugins are filters, scorers and "
    "pickers (router.pipeline)",
    "request_rewriter": "kvstack does not rewrite request bodies beyond the model name",
    "prefill_model_labels": "kvstack gives backends a role (backends[].role or the pod label "
    "kvstack.io/role) and lists PD models in router.pd.models",
    "decode_model_labels": "see --prefill-model-labels",
}


def add_production_stack_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("production-stack router flags (aliases)")
    group.add_argument("--service-discovery", choices=("static", "k8s"))
    group.add_argument("--static-backends", metavar="URL,URL")
    group.add_argument("--static-models", metavar="MODEL,MODEL")
    group.add_argument("--static-aliases", metavar="ALIAS:MODEL,...")
    group.add_argument("--k8s-label-selector")
    group.add_argument("--routing-logic", choices=(*ROUTING_LOGIC, "disaggregated_prefill"))
    group.add_argument("--session-key", metavar="HEADER")
    group.add_argument("--engine-stats-interval", type=float, metavar="S")
    group.add_argument("--max-instance-failover-reroute-attempts", type=int, metavar="N")
    group.add_argument("--log-level")
    group.add_argument("--request-stats-window", type=float, help=argparse.SUPPRESS)
    group.add_argument("--log-stats", action="store_true", default=None, help=argparse.SUPPRESS)
    group.add_argument("--log-stats-interval", type=float, help=argparse.SUPPRESS)
    for name in REFUSED:
        group.add_argument("--" + name.replace("_", "-"), help=argparse.SUPPRESS)


def production_stack_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ``router`` section keys production-stack's flags amount to (ConfigError for a flag
    kvstack cannot honour, or one that contradicts a kvstack flag)."""
    for name, instead in REFUSED.items():
        if getattr(args, name) is not None:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} has no kvstack equivalent: {instead}")
    for name in IGNORED:
        if getattr(args, name) is not None:
            flag = "--" + name.replace("_", "-")
            log.warning("%s is ignored: kvstack's statistics are on /metrics", flag)
    data: dict[str, Any] = {}
    _discovery(args, data)
    _backends(args, data)
    _routing(args, data)
    if args.engine_stats_interval is not None:
        data["scrape"] = {"interval_s": args.engine_stats_interval}
    if args.max_instance_failover_reroute_attempts is not None:
        data["retry"] = {"max_attempts": args.max_instance_failover_reroute_attempts + 1}
    if args.static_aliases:
        data["model_aliases"] = dict(_alias(a) for a in _split(args.static_aliases))
    if args.log_level:
        logging.getLogger().setLevel(args.log_level.upper())
    return data


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _discovery(args: argparse.Namespace, data: dict[str, Any]) -> None:
    kube: dict[str, Any] = {}
    if args.k8s_label_selector:
        kube["label_selector"] = args.k8s_label_selector
    if args.service_discovery:
        kind = "kubernetes" if args.service_discovery == "k8s" else "static"
        if args.discovery and args.discovery != kind:
            raise ConfigError(
                f"--service-discovery {args.service_discovery} contradicts --discovery "
                f"{args.discovery}"
            )
        data["discovery"] = {"kind": kind}
    if kube:
        data.setdefault("discovery", {})["kubernetes"] = kube


def _backends(args: argparse.Namespace, data: dict[str, Any]) -> None:
    if not args.static_backends:
        if args.static_models:
            raise ConfigError("--static-models needs --static-backends")
        return
    urls = _split(args.static_backends)
    backends: list[dict[str, Any]] = [{"url": url} for url in urls]
    if args.static_models:
        models = _split(args.static_models)
        if len(models) != len(urls):
            raise ConfigError(
                f"--static-models names {len(models)} models for {len(urls)} backends: give "
                "one per backend, in the same order"
            )
        for backend, model in zip(backends, models, strict=True):
            backend["models"] = [model]
    data["backends"] = backends


def _routing(args: argparse.Namespace, data: dict[str, Any]) -> None:
    if args.session_key:
        data["session_header"] = args.session_key
    logic = args.routing_logic
    if logic is None:
        return
    if logic == "disaggregated_prefill":
        raise ConfigError(
            "--routing-logic disaggregated_prefill: kvstack's prefill/decode is set up with "
            "backend roles and router.pd.models in the config file (docs/migrating.md)"
        )
    policy = ROUTING_LOGIC[logic]
    if args.policy and args.policy != policy:
        raise ConfigError(f"--routing-logic {logic} (policy {policy}) contradicts --policy")
    data["policy"] = policy
    if logic == "kvaware" and not args.index_url:
        log.info(
            "--routing-logic kvaware: the ttft policy routes on prefixes the router sent and "
            "KV events; add --index-url for hits in kvstack's shared tiers"
        )


def _alias(text: str) -> tuple[str, str]:
    alias, sep, model = text.partition(":")
    if not sep or not alias or not model:
        raise ConfigError(f"--static-aliases entry {text!r} must look like ALIAS:MODEL")
    return alias, model
