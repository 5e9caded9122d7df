"""Drive an engine's adapter endpoints over HTTP (vLLM's, or the simulator's copy of them).

vLLM 0.32 behaviour this driver is written against (checked on the CPU build):

- ``POST /v1/load_lora_adapter {lora_name, lora_path}`` answers 200; loading a name that is
  already loaded answers 400 ("has already been loaded"), so the driver confirms through
  ``/v1/models`` that the loaded name points at the same path and treats that as success;
  a missing path answers 404.
- ``POST /v1/unload_lora_adapter {lora_name}`` answers 200, then 404 for an unknown name
  (treated as success: the goal state holds). It only forgets the name in the API server; the
  weights stay in the engine's own LRU cache until displaced, and in-flight requests finish.
- ``GET /v1/models`` lists adapters with ``root`` = their path and ``parent`` = the base model.
- ``vllm:lora_requests_info`` is a gauge per label set set to the time of the last update;
  the newest sample's ``running_lora_adapters`` / ``waiting_lora_adapters`` are current.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from kvstack.errors import AdapterLoadError, require

require("httpx", "server")

import httpx  # noqa: E402

__all__ = ["EngineDriver", "EngineLoRAInfo", "HTTPEngineDriver"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EngineLoRAInfo:
    running: frozenset[str]
    waiting: frozenset[str]
    max_lora: int | None


class EngineDriver(Protocol):
    async def load(self, url: str, name: str, path: str, timeout_s: float) -> None:
        """Load ``name`` from ``path``; idempotent. Raises :class:`AdapterLoadError`."""

    async def unload(self, url: str, name: str, timeout_s: float) -> None:
        """Unload ``name``; idempotent (an unknown name is success)."""

    async def adapters(self, url: str, timeout_s: float) -> dict[str, str]:
        """Loaded adapters: engine-side name -> path."""

    async def lora_info(self, url: str, timeout_s: float) -> EngineLoRAInfo | None:
        """Adapters the engine reports running or waiting; None when it exports no such metric."""


class HTTPEngineDriver:
    """``api_key``: the engines' API key (vLLM's ``VLLM_API_KEY``, the router's
    ``auth.upstream_api_key``), sent on every call: with it set on the engines, only holders of
    the key reach vLLM's adapter endpoints."""

    def __init__(self, client: httpx.AsyncClient | None = None, api_key: str | None = None) -> None:
        headers = {"authorization": f"Bearer {api_key}"} if api_key else None
        self._client = client or httpx.AsyncClient(headers=headers)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def load(self, url: str, name: str, path: str, timeout_s: float) -> None:
        body = {"lora_name": name, "lora_path": path}
        resp = await self._post(f"{url}/v1/load_lora_adapter", body, timeout_s)
        if resp.status_code == 200:
            return
        text = resp.text[:300]
        if resp.status_code == 400 and "already been loaded" in text:
            loaded = await self.adapters(url, timeout_s)
            if loaded.get(name) == path:
                return
            raise AdapterLoadError("name_conflict", f"{name} is loaded from {loaded.get(name)!r}")
        reason = "not_found" if resp.status_code == 404 else f"http_{resp.status_code}"
        raise AdapterLoadError(reason, f"{url} load {name}: {text}")

    async def unload(self, url: str, name: str, timeout_s: float) -> None:
        resp = await self._post(f"{url}/v1/unload_lora_adapter", {"lora_name": name}, timeout_s)
        if resp.status_code not in (200, 404):
            raise AdapterLoadError(
                f"http_{resp.status_code}", f"{url} unload {name}: {resp.text[:300]}"
            )

    async def adapters(self, url: str, timeout_s: float) -> dict[str, str]:
        try:
            resp = await self._client.get(f"{url}/v1/models", timeout=timeout_s)
            resp.raise_for_status()
            cards = resp.json()["data"]
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            raise AdapterLoadError("engine_unreachable", f"{url}/v1/models: {exc}") from None
        return {c["id"]: str(c.get("root") or "") for c in cards if c.get("parent")}

    async def lora_info(self, url: str, timeout_s: float) -> EngineLoRAInfo | None:
        try:
            resp = await self._client.get(f"{url}/metrics", timeout=timeout_s)
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            raise AdapterLoadError("engine_unreachable", f"{url}/metrics: {exc}") from None
        return parse_lora_info(resp.text)

    async def _post(self, url: str, body: dict[str, str], timeout_s: float) -> httpx.Response:
        try:
            return await self._client.post(url, json=body, timeout=timeout_s)
        except httpx.TimeoutException:
            raise AdapterLoadError(
                "timeout", f"{url} did not answer in {timeout_s:.1f} s"
            ) from None
        except httpx.HTTPError as exc:
            raise AdapterLoadError("engine_unreachable", f"{url}: {exc}") from None


def parse_lora_info(metrics_text: str) -> EngineLoRAInfo | None:
    """The newest ``vllm:lora_requests_info`` sample, or None when absent."""
    from prometheus_client.parser import text_string_to_metric_families

    newest = None
    for family in text_string_to_metric_families(metrics_text):
        if family.name != "vllm:lora_requests_info":
            continue
        for sample in family.samples:
            if newest is None or sample.value > newest.value:
                newest = sample
    if newest is None:
        return None
    labels = newest.labels

    def names(key: str) -> frozenset[str]:
        return frozenset(n for n in labels.get(key, "").split(",") if n)

    max_lora = labels.get("max_lora")
    return EngineLoRAInfo(
        names("running_lora_adapters"),
        names("waiting_lora_adapters"),
        int(max_lora) if max_lora and max_lora.isdigit() else None,
    )
