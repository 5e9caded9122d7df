"""Result files in these tests skip the machine's memcpy and loopback references (seconds of
copying each); everything else of the envelope is written as in a real run."""

from __future__ import annotations

import pytest

from kvstack.bench import results


@pytest.fixture(autouse=True)
def _no_machine_references(monkeypatch: pytest.MonkeyPatch) -> None:
    facts = results.machine_facts
    monkeypatch.setattr(results, "machine_facts", lambda: facts(references=False))
