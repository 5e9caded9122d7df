"""The cluster KV index kept in Valkey or Redis (the ``valkey`` index backend).

Engines' announcers write it and routers and ``peer://`` tiers read it directly, so the index
has Valkey's replication, failover (Sentinel), sharding (Cluster), ACL users and TLS, and no
kvstack process of its own. Its answers are the index server's (:mod:`kvstack.index.answers`).

- :mod:`~kvstack.index.valkey.url` — the ``redis://`` / ``rediss://`` URL and its settings.
- :mod:`~kvstack.index.valkey.layout` — key names, hash-tagged buckets, holder bitmaps.
- :mod:`~kvstack.index.valkey.scripts` — the Lua scripts (registry updates, entry writes, upkeep).
- :mod:`~kvstack.index.valkey.registry` — the registry as readers see it; live engines.
- :mod:`~kvstack.index.valkey.reads` — lookup and locate flows (one round trip, sent ahead).
- :mod:`~kvstack.index.valkey.writes` — report and upkeep flows.
- :mod:`~kvstack.index.valkey.connect` — redis-py clients, pipelines, errors, drivers.
- :mod:`~kvstack.index.valkey.client` — ``ValkeyIndex`` and ``AsyncValkeyIndex``.
"""
