"""The router tests' reads of a ``/metrics`` page (prometheus_client's parser) and waits on
``/health``."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families


def metric_sum(url: str, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` on ``url``'s ``/metrics`` whose labels match."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def wait_health(url: str, status: int, timeout_s: float = 30.0) -> bool:
    """Until ``url``'s ``/health`` answers ``status``; False after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client() as http:
        while time.monotonic() < deadline:
            try:
                if http.get(f"{url}/health", timeout=5).status_code == status:
                    return True
            except httpx.TimeoutException:
                pass  # a loaded machine: ask again
            time.sleep(0.1)
    return False
