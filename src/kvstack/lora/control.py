"""``LoRAControl``: the control plane, resolver, cache manager and upkeep wired from config —
the one object a router (or ``kvstack up``) creates."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import SecretStr
from starlette.applications import Starlette

from kvstack.errors import ConfigError
from kvstack.lora.admin import create_admin_app
from kvstack.lora.config import LoRAConfig
from kvstack.lora.driver import EngineDriver, HTTPEngineDriver
from kvstack.lora.manager import AdapterCacheManager
from kvstack.lora.plane import ControlPlane
from kvstack.lora.resolver import Resolver
from kvstack.lora.upkeep import Upkeep
from kvstack.section import load_section, log_config_once

__all__ = ["LoRAControl"]


class LoRAControl:
    def __init__(self, config: LoRAConfig, plane: ControlPlane, driver: EngineDriver) -> None:
        self.config = config
        self.plane = plane
        self.resolver = Resolver(plane.registry, config)
        self.resolver.refresh()
        self.manager = AdapterCacheManager(
            config, self.resolver, plane.store, plane.verifier, plane.audit, driver
        )
        self.upkeep = Upkeep(self.manager)
        self._driver = driver

    @classmethod
    def from_config(
        cls,
        config: LoRAConfig | Mapping[str, Any] | None = None,
        driver: EngineDriver | None = None,
        engine_api_key: SecretStr | None = None,
    ) -> LoRAControl:
        """``engine_api_key``: the key the engines require (the router's upstream key)."""
        if not isinstance(config, LoRAConfig):
            config = load_section("lora", LoRAConfig, config)
        log_config_once("lora", config)
        key = None if engine_api_key is None else engine_api_key.get_secret_value()
        return cls(
            config, ControlPlane.from_config(config), driver or HTTPEngineDriver(api_key=key)
        )

    async def start(self) -> None:
        """Refresh the registry, adopt warm files, then keep everything reconciled."""
        await self.upkeep.once()
        self.upkeep.start()

    async def stop(self) -> None:
        await self.upkeep.stop()
        await self.manager.aclose()
        if isinstance(self._driver, HTTPEngineDriver):
            await self._driver.aclose()

    async def close(self) -> None:
        """Same as :meth:`stop` (the router closes its services by this name)."""
        await self.stop()

    def admin_app(self) -> Starlette:
        if self.config.admin_key is None:
            raise ConfigError("lora.admin_key must be set to serve the admin API")
        return create_admin_app(self.plane, self.manager, self.config.admin_key.get_secret_value())
