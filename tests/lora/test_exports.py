"""The package's lazy exports, and the names it exported before class names became unique."""

from __future__ import annotations

import pytest

import kvstack.lora as lora
from kvstack.lora.decision import AdapterDecision
from kvstack.lora.residency import ResidencyTier
from kvstack.lora.resolver import AdapterResolution


def test_every_exported_name_resolves() -> None:
    for name in lora.__all__:
        assert getattr(lora, name) is not None


@pytest.mark.parametrize(
    ("old", "new"),
    [("Decision", AdapterDecision), ("Resolution", AdapterResolution), ("Tier", ResidencyTier)],
)
def test_old_names_still_import_with_a_deprecation_warning(old: str, new: type) -> None:
    with pytest.warns(DeprecationWarning, match=f"kvstack.lora.{old} is deprecated"):
        assert getattr(lora, old) is new


def test_unknown_names_are_attribute_errors() -> None:
    with pytest.raises(AttributeError, match="Nope"):
        _ = lora.Nope
