"""Building blocks shared by the remote tiers (``redis://``, ``s3://``, ``peer://``).

- :mod:`~kvstack.kv.remote.breaker` — a circuit breaker: a failing remote is bypassed, retried
  later, and each incident is logged once and counted.
- :mod:`~kvstack.kv.remote.writer` — a bounded background write queue, so ``put`` never waits
  on the network.
- :mod:`~kvstack.kv.remote.codec` — the chunk format on the wire and in object stores: header
  plus payload, verified into caller buffers.
- :mod:`~kvstack.kv.remote.resp` — a small RESP2 client that reads bulk replies straight into
  tensors (no intermediate copies).
"""
