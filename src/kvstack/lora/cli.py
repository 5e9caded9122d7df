"""``kvstack adapters``: manage the adapter registry from a shell.

    kvstack adapters register SOURCE --id ID --version V --base-model M --tenant T --tier gold
    kvstack adapters list [--tenant T]
    kvstack adapters show ID
    kvstack adapters sign ID@V --key private.pem
    kvstack adapters verify ID@V
    kvstack adapters promote ID@V               (refused unless the version verifies)
    kvstack adapters canary ID@V --percent 10   (the same checks)
    kvstack adapters rollback ID
    kvstack adapters disable ID@V
    kvstack adapters keygen --out DIR          (an Ed25519 key pair for signing)
    kvstack adapters build-toy DIR... --base-model-dir BASE   (PEFT adapters of the toy model)
    kvstack adapters audit [ID] [--limit N]

``promote`` and ``canary`` first run every load-time check (digest, signature, base model and
engine compatibility). ``--force`` skips them, and is refused while ``lora.trusted_keys`` holds
a key: then the way to release a version is to sign it.

Settings come from the ``lora`` config section (``KVSTACK_CONFIG``, ``KVSTACK_LORA_*``);
``--registry-url`` and ``--store`` override the registry URL and the artifact store.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kvstack.errors import KVStackError
from kvstack.lora.adapters import AdapterVersion
from kvstack.lora.config import LoRAConfig

__all__ = ["run"]


def run(command: str, argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except KVStackError as exc:
        print(f"kvstack adapters {args.action}: {exc}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack adapters", description="manage LoRA adapters")
    p.add_argument("--registry-url", help="override lora.registry_url")
    p.add_argument("--store", help="override lora.artifact_store")
    p.add_argument("--actor", default=f"cli:{_user()}", help="who acts, for the audit log")
    sub = p.add_subparsers(dest="action", required=True)

    def cmd(
        name: str, handler: Callable[[argparse.Namespace], int], help_: str
    ) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_)
        sp.set_defaults(handler=handler)
        return sp

    r = cmd("register", _register, "verify and register a new adapter version")
    r.add_argument("source", help="directory or s3:// prefix with the PEFT files")
    for flag in ("--id", "--version", "--base-model", "--tenant", "--tier"):
        r.add_argument(flag, required=True)
    r.add_argument("--base-model-revision", default="")
    r.add_argument("--tokenizer-revision", default="")
    r.add_argument("--staged", action="store_true", help="do not activate a first version")
    cmd("list", _list, "list adapter versions").add_argument("--tenant")
    cmd("show", _show, "show an adapter's release and versions").add_argument("adapter_id")
    s = cmd("sign", _sign, "sign a version with an Ed25519 private key")
    s.add_argument("ref", help="ID@VERSION")
    s.add_argument("--key", required=True, type=Path)
    cmd("verify", _verify, "fetch and verify a stored version").add_argument("ref")
    pr = cmd("promote", _promote, "make a version stable (once it verifies)")
    pr.add_argument("ref")
    c = cmd("canary", _canary, "send a share of the traffic to a version (once it verifies)")
    c.add_argument("ref")
    c.add_argument("--percent", type=float, required=True)
    for release_parser in (pr, c):
        release_parser.add_argument(
            "--force",
            action="store_true",
            help="release without verification; refused while lora.trusted_keys is set",
        )
    cmd("rollback", _rollback, "end a canary, else go back to the previous stable").add_argument(
        "adapter_id"
    )
    cmd("disable", _disable, "never serve a version again").add_argument("ref")
    k = cmd("keygen", _keygen, "write an Ed25519 key pair")
    k.add_argument("--out", type=Path, required=True)
    b = cmd("build-toy", _build_toy, "write real PEFT adapters of kvstack's toy model")
    b.add_argument("out", nargs="+", type=Path, help="one adapter directory each")
    b.add_argument("--base-model-dir", type=Path, required=True,
                   help="where the toy model goes (lora.base_models.<name>.path)")  # fmt: skip
    b.add_argument("--seed", type=int, default=1, help="the first adapter's seed; then +1 each")
    b.add_argument("--rank", type=int, default=8)
    a = cmd("audit", _audit, "show the audit log, newest first")
    a.add_argument("adapter_id", nargs="?")
    a.add_argument("--limit", type=int, default=50)
    return p


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _config(args: argparse.Namespace) -> LoRAConfig:
    from kvstack.section import load_section

    overrides: dict[str, Any] = {}
    if args.registry_url:
        overrides["registry_url"] = args.registry_url
    if args.store:
        overrides["artifact_store"] = args.store
    return load_section("lora", LoRAConfig, overrides)


def _plane(args: argparse.Namespace, config: LoRAConfig | None = None) -> Any:
    from kvstack.lora.plane import ControlPlane

    return ControlPlane.from_config(config or _config(args))


def _registry(args: argparse.Namespace) -> Any:
    """Read-only commands need the registry only (no keys, no store)."""
    from kvstack.lora.registry import AdapterRegistry

    return AdapterRegistry(_config(args).registry_url)


def _ref(ref: str) -> tuple[str, str]:
    from kvstack.errors import RegistryError
    from kvstack.lora.adapters import split_engine_name

    parsed = split_engine_name(ref)
    if parsed is None:
        raise RegistryError(f"{ref!r} is not ID@VERSION")
    return parsed


def _print_json(value: Any) -> int:
    print(json.dumps(value, indent=2, sort_keys=True, default=str))
    return 0


def _row(v: AdapterVersion) -> dict[str, Any]:
    return {**asdict(v), "status": v.status.value}


def _register(a: argparse.Namespace) -> int:
    config = _config(a)
    v = _plane(a, config).register(
        a.source,
        a.id,
        a.version,
        a.base_model,
        a.tenant,
        a.tier,
        a.actor,
        activate_first=not a.staged,
        base_model_revision=a.base_model_revision,
        tokenizer_revision=a.tokenizer_revision,
    )
    status = v.status.value
    if not v.signature and config.require_signature and status == "active":
        status = (
            f"active, unsigned: not served until signed (kvstack adapters sign {v.engine_name})"
        )
    print(f"registered {v.engine_name} ({status}) sha256={v.sha256} rank={v.rank}")
    return 0


def iso_time(epoch_s: float) -> str:
    """``2026-12-01T18:36:48.123Z``: ISO-8601 in UTC, as the listings print times."""
    moment = datetime.fromtimestamp(epoch_s, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _list(a: argparse.Namespace) -> int:
    versions = _registry(a).list_adapters(a.tenant)
    header = f"{'ADAPTER@VERSION':<40} {'STATUS':<10} {'TENANT':<16} {'TIER':<10} {'RANK':>4}"
    print(f"{header}  SIGNED  {'CREATED':<24}")
    for v in versions:
        signed = "yes" if v.signature else "no"
        print(
            f"{v.engine_name:<40} {v.status.value:<10} {v.tenant_id:<16} {v.priority_tier:<10} "
            f"{v.rank:>4}  {signed:<6}  {iso_time(v.created_at)}"
        )
    return 0


def _show(a: argparse.Namespace) -> int:
    from kvstack.errors import RegistryError

    registry = _registry(a)
    release = registry.release(a.adapter_id)
    if release is None:
        raise RegistryError(f"unknown adapter {a.adapter_id!r}")
    versions = [_row(v) for v in registry.versions(a.adapter_id)]
    return _print_json({"release": asdict(release), "versions": versions})


def _sign(a: argparse.Namespace) -> int:
    v = _plane(a).sign(*_ref(a.ref), a.key, a.actor)
    print(f"signed {v.engine_name} with key {v.signer}")
    return 0


def _verify(a: argparse.Namespace) -> int:
    v = _plane(a).verify(*_ref(a.ref), a.actor)
    print(f"verified {v.engine_name}: digest, signature, format and shapes ok")
    return 0


def _promote(a: argparse.Namespace) -> int:
    return _print_json(asdict(_plane(a).promote(*_ref(a.ref), a.actor, force=a.force)))


def _canary(a: argparse.Namespace) -> int:
    adapter_id, version = _ref(a.ref)
    release = _plane(a).canary(adapter_id, version, a.percent, a.actor, force=a.force)
    return _print_json(asdict(release))


def _rollback(a: argparse.Namespace) -> int:
    return _print_json(asdict(_plane(a).rollback(a.adapter_id, a.actor)))


def _disable(a: argparse.Namespace) -> int:
    return _print_json(asdict(_plane(a).disable(*_ref(a.ref), a.actor)))


def _keygen(a: argparse.Namespace) -> int:
    from kvstack.lora.signing import generate_keypair

    a.out.mkdir(parents=True, exist_ok=True)
    key_id = generate_keypair(a.out / "signing-key.pem", a.out / "signing-key.pub.pem")
    print(f"key {key_id}: {a.out / 'signing-key.pem'} (private), {a.out / 'signing-key.pub.pem'}")
    return 0


def _build_toy(a: argparse.Namespace) -> int:
    """Adapters to try the control plane with, without a model download: the random-weight toy
    Llama (kvstack.models.toy) copied to ``--base-model-dir`` and one PEFT adapter of it per
    directory (peft's own ``save_pretrained``, random non-zero weights, distinct seeds)."""
    import shutil

    from kvstack.models.toy import build_toy_lora, build_toy_model

    model = build_toy_model()
    shutil.copytree(model, a.base_model_dir, dirs_exist_ok=True)
    print(f"toy model: {a.base_model_dir}")
    for seed, out in enumerate(a.out, start=a.seed):
        build_toy_lora(a.base_model_dir, out, rank=a.rank, seed=seed)
        print(f"adapter: {out} (rank {a.rank}, q_proj and v_proj, seed {seed})")
    return 0


def _audit(a: argparse.Namespace) -> int:
    from kvstack.lora.audit import AuditLog

    for e in AuditLog(_config(a).registry_url).entries(a.adapter_id, limit=a.limit):
        print(
            f"{iso_time(e.ts)} {e.actor:<20} {e.action:<9} {e.adapter_id}@{e.version:<8} "
            f"{e.decision:<7} {e.latency_ms:8.1f}ms {e.reason}"
        )
    return 0
