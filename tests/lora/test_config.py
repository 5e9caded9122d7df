"""The ``lora`` section is a leaf: loading it loads no runtime module, and its rule schema is
the facts the manager builds."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

from kvstack.lora.facts import FACT_TYPES, AdapterFacts

# What the section may load: itself, the pure rule language and fact schema, and the leaves.
CONFIG_LEVEL = {
    "kvstack",
    "kvstack.errors",
    "kvstack.redact",
    "kvstack.section",
    "kvstack.lora",
    "kvstack.lora.config",
    "kvstack.lora.expr",
    "kvstack.lora.facts",
}


def test_loading_the_section_loads_no_runtime_module() -> None:
    code = (
        "import json, sys; import kvstack.lora.config; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('kvstack'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert set(json.loads(done.stdout)) == CONFIG_LEVEL


def test_rules_are_checked_against_every_fact_and_nothing_else() -> None:
    fields = {f.name: f.type for f in dataclasses.fields(AdapterFacts)}
    assert {name: kind.__name__ for name, kind in FACT_TYPES.items()} == fields
