"""Adapter builders for tests: fast synthetic PEFT files (numpy + safetensors) and real PEFT
adapters trained-free on the toy Llama (transformers + peft)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from kvstack.lora.audit import AuditLog
from kvstack.lora.basemodel import BaseModelDims
from kvstack.lora.config import LoRAConfig
from kvstack.lora.control import LoRAControl
from kvstack.lora.driver import HTTPEngineDriver
from kvstack.lora.plane import ControlPlane
from kvstack.lora.registry import AdapterRegistry
from kvstack.lora.signing import TrustedKeys
from kvstack.lora.store.dir import DirStore
from kvstack.lora.verify import Verifier

# The control plane's invariants, all zero: pinned evictions, wrong-version answers, unverified
# loads (LoRAMetrics.invariants).
NO_VIOLATIONS = {"pinned_eviction": 0, "wrong_version": 0, "unverified_load": 0}

TINY_DIMS = BaseModelDims(
    name="toy",
    hidden_size=128,
    intermediate_size=256,
    num_layers=2,
    num_heads=2,
    num_kv_heads=2,
    head_dim=64,
)


def synthetic_adapter(
    dest: Path,
    base: BaseModelDims = TINY_DIMS,
    rank: int = 8,
    modules: Sequence[str] = ("q_proj", "v_proj"),
    seed: int = 0,
    shape_rank: int | None = None,
) -> Path:
    """A PEFT-format adapter directory with random float32 weights (no torch needed)."""
    rng = np.random.default_rng(seed)
    tensors = {}
    r = shape_rank or rank
    for layer in range(base.num_layers):
        for module in modules:
            group = (
                "self_attn" if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            )
            in_f, out_f = base.module_dims(module) or (0, 0)
            stem = f"base_model.model.model.layers.{layer}.{group}.{module}"
            tensors[f"{stem}.lora_A.weight"] = rng.standard_normal((r, in_f), dtype=np.float32)
            tensors[f"{stem}.lora_B.weight"] = rng.standard_normal((out_f, r), dtype=np.float32)
    dest.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dest / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": list(modules),
        "bias": "none",
    }
    (dest / "adapter_config.json").write_text(json.dumps(config))
    return dest


def peft_adapter(model_dir: Path, dest: Path, seed: int, rank: int = 8) -> Path:
    """A real PEFT adapter with random (non-zero) B matrices, saved by ``save_pretrained``."""
    import peft
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float16)
    config = peft.LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=["q_proj", "v_proj"],
        init_lora_weights=False,  # random B: the adapter changes the output
    )
    peft.get_peft_model(model, config).save_pretrained(dest)
    return dest


def real_plane(tmp: Path, sources: Path, keys: tuple[Path, Path], model_dir: Path) -> ControlPlane:
    """A control plane on ``tmp`` (SQLite registry, directory store) for adapters of the toy
    model in ``model_dir``, from ``sources``, signed with ``keys`` (private, public)."""
    config = LoRAConfig(
        registry_url=f"sqlite:///{tmp / 'r.db'}",
        artifact_store=f"file://{tmp / 's'}",
        source_allowlist=[sources.as_uri() + "/"],
        trusted_keys=[str(keys[1])],
    )
    dims = BaseModelDims.from_config_dir("toy", model_dir)
    verifier = Verifier(config, {"toy": dims}, TrustedKeys.load(config.trusted_keys))
    return ControlPlane(
        config,
        AdapterRegistry(config.registry_url),
        DirStore(tmp / "s"),
        verifier,
        AuditLog(config.registry_url),
    )


def control_over(plane: ControlPlane, **update: object) -> LoRAControl:
    """A control plane and cache manager over ``plane``'s registry, store, verifier and audit
    log, with ``update`` applied to its config (engines, request classes, tenants...)."""
    config = plane.config.model_copy(update=update)
    same = ControlPlane(config, plane.registry, plane.store, plane.verifier, plane.audit)
    return LoRAControl(config, same, HTTPEngineDriver())
