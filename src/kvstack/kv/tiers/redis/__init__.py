"""``redis://`` / ``rediss://``: chunks in Redis, Valkey or a Redis Cluster.

- :mod:`.tier` — :class:`~kvstack.kv.tiers.redis.tier.RedisTier`.
- :mod:`.redis_url` — URL parameters; :mod:`.redis_nodes` — key to node, pooled connections.
- :mod:`.resp` — the RESP2 client that receives values straight into tensors (measured: why).
- :mod:`.redis_io` — pipelined chunk reads and writes on one connection.
- :mod:`.redis_server` — how redis-server is started for chunks.
"""
