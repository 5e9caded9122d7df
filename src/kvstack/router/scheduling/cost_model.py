"""The predicted-TTFT cost model: a request's time to first token on each backend.

    ttft = (base + (queued + uncached) / prefill_rate + running * per_running) * kv_factor

- ``queued``: prompt tokens the router sent to the backend that have not reached their first
  token yet (each counted after its own prefix credit): prefill work ahead of this request;
- ``uncached``: this request's prompt tokens minus its tier-weighted cached prefix there;
- ``running``: requests on the backend (router in flight plus the engine's own count): decode
  steps share the batch with the prefill;
- ``kv_factor = 1 + kv_penalty * pressure^2``, ``pressure`` rising from 0 at ``kv_threshold``
  KV usage to 1 when full (preemption and eviction loom).

The choice minimises ``ttft + evict``: ``evict = eviction_weight * fullness * uncached /
prefill_rate`` prices the prefixes this request's new blocks push out of a backend whose cache
is full of them (``fullness``: the share of its KV capacity holding cached prefixes): they will
be recomputed later. Without it a greedy TTFT choice spreads every prefix a little whenever a
queue forms, and a fleet near its KV capacity thrashes.

There is no switch between a "cache mode" and a "load mode": a backend holding the prefix wins
while its queue is shorter than the prefill it saves, and a hot prefix spreads by itself once
the queue on its holders costs more than recomputing it elsewhere.

The coefficients (``base``, seconds per 1,000 prefill tokens, seconds per running request)
are learnt online per backend from observed TTFTs — normalized least mean squares, clamped to
non-negative values, starting from a fleet-wide estimate that every observation also updates.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CostInputs", "CostModel", "CostPrior", "Prediction"]

_MIN_S_PER_KTOK = 1e-6
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class CostPrior:
    prefill_tokens_per_s: float = 8000.0
    base_s: float = 0.02
    per_running_s: float = 0.002

    def weights(self) -> list[float]:
        return [self.base_s, 1000.0 / self.prefill_tokens_per_s, self.per_running_s * 10]


@dataclass(frozen=True, slots=True)
class CostInputs:
    queued_tokens: float
    uncached_tokens: float
    running: float
    kv_usage: float | None = None
    prompt_tokens: int = 0
    cached_credit: float = 0.0
    fullness: float = 0.0  # share of the backend's KV capacity holding cached prefixes

    def features(self) -> list[float]:
        """Scaled to similar magnitudes (thousands of tokens, tens of requests), so the
        normalized updates share the error evenly."""
        return [1.0, (self.queued_tokens + self.uncached_tokens) / 1000.0, self.running / 10.0]


@dataclass(frozen=True, slots=True)
class Prediction:
    ttft_s: float
    inputs: CostInputs
    evict_s: float = 0.0  # the later recomputation of the prefixes this request evicts

    @property
    def cost_s(self) -> float:
        return self.ttft_s + self.evict_s

    def note(self) -> str:
        i = self.inputs
        kv = "-" if i.kv_usage is None else f"{i.kv_usage:.2f}"
        return (
            f"{self.ttft_s * 1000:.0f}ms(queued={i.queued_tokens:.0f},"
            f"uncached={i.uncached_tokens:.0f}/{i.prompt_tokens},running={i.running:.0f},"
            f"kv={kv},full={i.fullness:.2f},evict={self.evict_s * 1000:.0f}ms)"
        )


class _Linear:
    __slots__ = ("samples", "w")

    def __init__(self, weights: list[float]) -> None:
        self.w = list(weights)
        self.samples = 0

    def predict(self, x: list[float]) -> float:
        return sum(wi * xi for wi, xi in zip(self.w, x, strict=True))

    def learn(self, x: list[float], y: float, rate: float) -> None:
        error = y - self.predict(x)
        norm = sum(xi * xi for xi in x) + _EPS
        self.w = [wi + rate * error * xi / norm for wi, xi in zip(self.w, x, strict=True)]
        self.w[0] = max(0.0, self.w[0])
        self.w[1] = max(_MIN_S_PER_KTOK, self.w[1])
        self.w[2] = max(0.0, self.w[2])
        self.samples += 1


class CostModel:
    def __init__(
        self,
        prior: CostPrior | None = None,
        learning_rate: float = 0.1,
        kv_threshold: float = 0.8,
        kv_penalty: float = 3.0,
        warmup_samples: int = 20,
        eviction_weight: float = 1.0,
    ) -> None:
        if not 0 < learning_rate <= 1:
            raise ValueError(f"learning_rate must be in (0, 1], got {learning_rate}")
        if not 0 <= kv_threshold < 1:
            raise ValueError(f"kv_threshold must be in [0, 1), got {kv_threshold}")
        if kv_penalty < 0:
            raise ValueError(f"kv_penalty must be >= 0, got {kv_penalty}")
        if eviction_weight < 0:
            raise ValueError(f"eviction_weight must be >= 0, got {eviction_weight}")
        self.eviction_weight = eviction_weight
        self.prior = prior or CostPrior()
        self.learning_rate = learning_rate
        self.kv_threshold = kv_threshold
        self.kv_penalty = kv_penalty
        self.warmup_samples = warmup_samples
        self.fleet = _Linear(self.prior.weights())
        self._backends: dict[str, _Linear] = {}

    def _model(self, backend_id: str) -> _Linear:
        """The backend's own model once it has enough samples, else the fleet's."""
        own = self._backends.get(backend_id)
        return own if own is not None and own.samples >= self.warmup_samples else self.fleet

    def predict(self, backend_id: str, inputs: CostInputs) -> Prediction:
        model = self._model(backend_id)
        ttft_s = model.predict(inputs.features()) * self._kv_factor(inputs)
        s_per_token = model.w[1] / 1000.0
        evict_s = self.eviction_weight * inputs.fullness * inputs.uncached_tokens * s_per_token
        return Prediction(ttft_s, inputs, evict_s)

    def _kv_factor(self, inputs: CostInputs) -> float:
        if inputs.kv_usage is None or inputs.kv_usage <= self.kv_threshold:
            return 1.0
        pressure = min(1.0, (inputs.kv_usage - self.kv_threshold) / (1.0 - self.kv_threshold))
        return 1.0 + self.kv_penalty * pressure * pressure

    def observe(self, backend_id: str, inputs: CostInputs, observed_s: float) -> None:
        """Learn from a TTFT observed for ``inputs`` (the KV factor is left out of learning:
        it models risk, not the linear cost)."""
        x = inputs.features()
        y = observed_s / self._kv_factor(inputs)
        self.fleet.learn(x, y, self.learning_rate)
        own = self._backends.get(backend_id)
        if own is None:
            own = self._backends[backend_id] = _Linear(self.fleet.w)
        own.learn(x, y, self.learning_rate)

    def rates(self, backend_id: str) -> tuple[float, float, float]:
        """(base s, prefill tokens/s, s per running request) in use for a backend."""
        w = self._model(backend_id).w
        return w[0], 1000.0 / w[1], w[2] / 10.0
