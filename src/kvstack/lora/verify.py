"""Verification: nothing reaches an engine unless every check here passed.

Two entry points, both raising :class:`VerificationError` with a machine-readable ``reason``:

- :meth:`Verifier.check_source` and :meth:`Verifier.inspect_source` at registration: the source
  URI is on the allowlist and has no traversal; the directory holds only the PEFT files (no
  pickle, nothing unexpected); the format and shapes match the base model.
- :meth:`Verifier.verify_for_engine` before a load: the fetched files hash to the registry's
  digest, a trusted key signed them, and adapter, base model and engine are compatible.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlparse

from kvstack.errors import VerificationError
from kvstack.lora.adapters import AdapterVersion
from kvstack.lora.basemodel import BaseModelDims
from kvstack.lora.config import AdapterEngineSpec, LoRAConfig
from kvstack.lora.manifest import ADAPTER_FILES, Manifest
from kvstack.lora.peft_format import AdapterInfo, inspect_adapter
from kvstack.lora.signing import TrustedKeys

__all__ = ["Inspection", "Verifier", "check_no_traversal"]

_PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npy"}
# Files a training run leaves next to the adapter that are harmless text and are not copied.
_IGNORED_FILES = {"README.md", "LICENSE", "LICENSE.txt", ".gitattributes"}
_PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"PK\x03\x04")


@dataclass(frozen=True, slots=True)
class Inspection:
    info: AdapterInfo
    manifest: Manifest


def check_no_traversal(uri: str) -> str:
    """The URI's path, refusing ``..`` segments (also percent-encoded) and NUL bytes."""
    path = unquote(urlparse(uri).path if "://" in uri else uri)
    if "\x00" in path or ".." in PurePosixPath(path).parts or "\\" in path:
        raise VerificationError("path_traversal", f"{uri!r} escapes its directory")
    return path


class Verifier:
    def __init__(
        self,
        config: LoRAConfig,
        base_models: Mapping[str, BaseModelDims],
        trusted: TrustedKeys,
    ) -> None:
        self.config = config
        self.base_models = dict(base_models)
        self.trusted = trusted

    @classmethod
    def from_config(cls, config: LoRAConfig) -> Verifier:
        bases = {
            name: BaseModelDims.from_config_dir(
                name, ref.path, ref.revision, ref.tokenizer_revision
            )
            for name, ref in config.base_models.items()
        }
        return cls(config, bases, TrustedKeys.load(config.trusted_keys))

    def base(self, name: str) -> BaseModelDims:
        found = self.base_models.get(name)
        if found is None:
            known = ", ".join(sorted(self.base_models)) or "none configured"
            raise VerificationError("unknown_base_model", f"{name!r}; known: {known}")
        return found

    # -- registration ---------------------------------------------------------------------

    def check_source(self, uri: str) -> None:
        """The source is on the allowlist and stays inside it."""
        check_no_traversal(uri)
        normalised = uri if "://" in uri else Path(uri).absolute().as_uri()
        allowed = self.config.source_allowlist
        if not any(normalised.startswith(prefix) for prefix in allowed):
            raise VerificationError(
                "source_not_allowed", f"{uri!r} is not under an allowed source {allowed}"
            )

    def inspect_source(self, path: Path, base_model: str) -> Inspection:
        """Check a fetched source directory's files, format and shapes against the base model."""
        check_files(path, allow_ignored=True)
        info = inspect_adapter(
            path,
            self.base(base_model),
            tuple(self.config.supported_modules),
            self.config.max_adapter_bytes,
        )
        return Inspection(info, Manifest.of_dir(path))

    # -- before a load --------------------------------------------------------------------

    def verify_for_engine(
        self, path: Path, adapter: AdapterVersion, engine: AdapterEngineSpec
    ) -> None:
        """Full check of a fetched artifact for one engine; raises on the first failure."""
        check_files(path, allow_ignored=False)
        manifest = Manifest.of_dir(path)
        if manifest.digest != adapter.sha256:
            raise VerificationError(
                "digest_mismatch",
                f"files hash to {manifest.digest[:16]}…, registry says {adapter.sha256[:16]}…",
            )
        if self.config.require_signature or adapter.signature:
            self.trusted.verify(adapter)
        self.check_compatible(adapter, engine)
        info = self.inspect_source(path, adapter.base_model).info
        if info.rank != adapter.rank or info.target_modules != tuple(
            sorted(adapter.target_modules)
        ):
            raise VerificationError("registry_mismatch", "rank or target modules differ")

    def check_compatible(self, adapter: AdapterVersion, engine: AdapterEngineSpec) -> None:
        if adapter.base_model != engine.base_model:
            raise VerificationError(
                "base_model_mismatch",
                f"{adapter.engine_name} is for {adapter.base_model!r}, engine serves "
                f"{engine.base_model!r}",
            )
        base = self.base(adapter.base_model)
        if adapter.base_model_revision and base.revision not in ("", adapter.base_model_revision):
            raise VerificationError(
                "base_model_mismatch", f"revision {adapter.base_model_revision} != {base.revision}"
            )
        tok = adapter.tokenizer_revision
        if tok and base.tokenizer_revision not in ("", tok):
            raise VerificationError("tokenizer_mismatch", f"{tok} != {base.tokenizer_revision}")
        if adapter.rank > engine.max_lora_rank:
            raise VerificationError(
                "rank_exceeds_engine",
                f"rank {adapter.rank} > the engine's max LoRA rank {engine.max_lora_rank}",
            )
        unsupported = set(adapter.target_modules) - set(self.config.supported_modules)
        if unsupported:
            raise VerificationError("unsupported_module", f"{sorted(unsupported)}")


def check_files(path: Path, allow_ignored: bool) -> None:
    """Exactly the PEFT files, regular and not links; never a pickle."""
    if not path.is_dir():
        raise VerificationError("missing_file", f"{path} is not a directory")
    for entry in sorted(path.iterdir()):
        if entry.is_symlink() or not entry.is_file():
            raise VerificationError("unexpected_file", f"{entry.name} is not a regular file")
        if entry.name in ADAPTER_FILES:
            continue  # their own parsers check them; a safetensors length may look like magic
        if entry.suffix.lower() in _PICKLE_SUFFIXES or _looks_pickled(entry):
            raise VerificationError("pickle_file", f"{entry.name} may hold pickled code")
        if allow_ignored and entry.name in _IGNORED_FILES:
            continue
        raise VerificationError(
            "unexpected_file", f"{entry.name}; only {', '.join(ADAPTER_FILES)} are accepted"
        )
    for name in ADAPTER_FILES:
        if not (path / name).is_file():
            raise VerificationError("missing_file", f"{name} is missing")


def _looks_pickled(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(4)
    return any(head.startswith(magic) for magic in _PICKLE_MAGIC)
