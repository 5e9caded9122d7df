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

Every verb prints text for people (lines, and tables for ``list`` and ``show``, times as
ISO-8601); ``--json`` after the verb prints one JSON document instead, for scripts: a version's
fields for ``register``, ``sign`` and ``verify``, the release (stable, canary, rollback) for
``promote``, ``canary``, ``rollback`` and ``disable``, ``{"versions": [...]}`` for ``list``,
``{"release": ..., "versions": [...]}`` for ``show``, ``{"entries": [...]}`` for ``audit``.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvstack.errors import KVStackError
from kvstack.lora.cli_output import (
    Shown,
    audit_lines,
    audit_row,
    release_line,
    release_row,
    version_row,
    version_table,
)
from kvstack.lora.config import LoRAConfig
from kvstack.output import add_json_flag, print_json

__all__ = ["run"]


def run(command: str, argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        shown: Shown = args.handler(args)
    except KVStackError as exc:
        print(f"kvstack adapters {args.action}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        return print_json(shown.data)
    if shown.text:
        print(shown.text)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvstack adapters", description="manage LoRA adapters")
    p.add_argument("--registry-url", help="override lora.registry_url")
    p.add_argument("--store", help="override lora.artifact_store")
    p.add_argument("--actor", default=f"cli:{_user()}", help="who acts, for the audit log")
    sub = p.add_subparsers(dest="action", required=True)

    def cmd(
        name: str, handler: Callable[[argparse.Namespace], Shown], help_: str
    ) -> argparse.ArgumentParser:
        sp = add_json_flag(sub.add_parser(name, help=help_))
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


def _register(a: argparse.Namespace) -> Shown:
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
    unserved = not v.signature and config.require_signature and status == "active"
    if unserved:
        status = (
            f"active, unsigned: not served until signed (kvstack adapters sign {v.engine_name})"
        )
    text = f"registered {v.engine_name} ({status}) sha256={v.sha256} rank={v.rank}"
    return Shown(text, {**version_row(v), "served": status == "active"})


def _list(a: argparse.Namespace) -> Shown:
    versions = _registry(a).list_adapters(a.tenant)
    return Shown(version_table(versions), {"versions": [version_row(v) for v in versions]})


def _show(a: argparse.Namespace) -> Shown:
    from kvstack.errors import RegistryError

    registry = _registry(a)
    release = registry.release(a.adapter_id)
    if release is None:
        raise RegistryError(f"unknown adapter {a.adapter_id!r}")
    versions = registry.versions(a.adapter_id)
    text = f"{release_line(release)}\n{version_table(versions)}"
    data = {"release": release_row(release), "versions": [version_row(v) for v in versions]}
    return Shown(text, data)


def _sign(a: argparse.Namespace) -> Shown:
    v = _plane(a).sign(*_ref(a.ref), a.key, a.actor)
    return Shown(f"signed {v.engine_name} with key {v.signer}", version_row(v))


def _verify(a: argparse.Namespace) -> Shown:
    v = _plane(a).verify(*_ref(a.ref), a.actor)
    text = f"verified {v.engine_name}: digest, signature, format and shapes ok"
    return Shown(text, version_row(v))


def _released(verb: str, release: Any) -> Shown:
    return Shown(f"{verb}: {release_line(release)}", release_row(release))


def _promote(a: argparse.Namespace) -> Shown:
    return _released("promoted", _plane(a).promote(*_ref(a.ref), a.actor, force=a.force))


def _canary(a: argparse.Namespace) -> Shown:
    adapter_id, version = _ref(a.ref)
    release = _plane(a).canary(adapter_id, version, a.percent, a.actor, force=a.force)
    return _released("canary", release)


def _rollback(a: argparse.Namespace) -> Shown:
    return _released("rolled back", _plane(a).rollback(a.adapter_id, a.actor))


def _disable(a: argparse.Namespace) -> Shown:
    return _released(f"disabled {a.ref}", _plane(a).disable(*_ref(a.ref), a.actor))


def _keygen(a: argparse.Namespace) -> Shown:
    from kvstack.lora.signing import generate_keypair

    a.out.mkdir(parents=True, exist_ok=True)
    private, public = a.out / "signing-key.pem", a.out / "signing-key.pub.pem"
    key_id = generate_keypair(private, public)
    text = f"key {key_id}: {private} (private), {public}"
    return Shown(text, {"key_id": key_id, "private_key": str(private), "public_key": str(public)})


def _build_toy(a: argparse.Namespace) -> Shown:
    """Adapters to try the control plane with, without a model download: the random-weight toy
    Llama (kvstack.models.toy) copied to ``--base-model-dir`` and one PEFT adapter of it per
    directory (peft's own ``save_pretrained``, random non-zero weights, distinct seeds)."""
    import shutil

    from kvstack.models.toy import build_toy_lora, build_toy_model

    model = build_toy_model()
    shutil.copytree(model, a.base_model_dir, dirs_exist_ok=True)
    lines, adapters = [f"toy model: {a.base_model_dir}"], []
    for seed, out in enumerate(a.out, start=a.seed):
        build_toy_lora(a.base_model_dir, out, rank=a.rank, seed=seed)
        lines.append(f"adapter: {out} (rank {a.rank}, q_proj and v_proj, seed {seed})")
        adapters.append({"path": str(out), "rank": a.rank, "seed": seed})
    return Shown("\n".join(lines), {"base_model_dir": str(a.base_model_dir), "adapters": adapters})


def _audit(a: argparse.Namespace) -> Shown:
    from kvstack.lora.audit import AuditLog

    entries = AuditLog(_config(a).registry_url).entries(a.adapter_id, limit=a.limit)
    return Shown(audit_lines(entries), {"entries": [audit_row(e) for e in entries]})
