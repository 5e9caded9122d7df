"""What the remote tiers (``redis://``, ``s3://``, ``peer://``) have in common.

- :mod:`.breaker` — a circuit breaker: a failing remote is bypassed, retried later, and each
  incident is logged once and counted.
- :mod:`.queued` — the base of tiers that write through a background queue: queued chunks are
  read from the queue, the rest from the remote.
- :mod:`.codec` — the chunk format on the wire and in object stores: header plus payload,
  verified into caller buffers.
- :mod:`.options` — typed readers of URL parameters.
- :mod:`.pool` — idle connections to one server, reused across calls.
- :mod:`.known` — keys known to be stored remotely (``contains`` without a round trip).
"""
