"""A base model's dimensions, read from its Hugging Face ``config.json``, and the input/output
sizes of the linear modules a LoRA adapter may target (the shapes its A and B matrices must have).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvstack.errors import ConfigError

__all__ = ["BaseModelDims"]


@dataclass(frozen=True, slots=True)
class BaseModelDims:
    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    revision: str = ""
    tokenizer_revision: str = ""

    @classmethod
    def from_config_dir(
        cls, name: str, path: str | Path, revision: str = "", tokenizer_revision: str = ""
    ) -> BaseModelDims:
        file = Path(path).expanduser() / "config.json"
        try:
            cfg = json.loads(file.read_text())
            num_heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            return cls(
                name=name,
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=num_heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
                head_dim=int(cfg.get("head_dim") or hidden // num_heads),
                revision=revision,
                tokenizer_revision=tokenizer_revision,
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"base model {name!r}: cannot read dims from {file}: {exc}") from None

    def write_config_dir(self, path: str | Path) -> Path:
        """Write the ``config.json`` :meth:`from_config_dir` reads (for benchmarks and tests
        that stand in a base model's dimensions without its weights); returns ``path``."""
        dest = Path(path)
        dest.mkdir(parents=True, exist_ok=True)
        cfg = {
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
        }
        (dest / "config.json").write_text(json.dumps(cfg))
        return dest

    def module_dims(self, module: str) -> tuple[int, int] | None:
        """(in_features, out_features) of a target module; None for an unknown module."""
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        dims = {
            "q_proj": (self.hidden_size, q_out),
            "k_proj": (self.hidden_size, kv_out),
            "v_proj": (self.hidden_size, kv_out),
            "o_proj": (q_out, self.hidden_size),
            "gate_proj": (self.hidden_size, self.intermediate_size),
            "up_proj": (self.hidden_size, self.intermediate_size),
            "down_proj": (self.intermediate_size, self.hidden_size),
        }
        return dims.get(module)
