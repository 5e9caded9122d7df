"""Prefix knowledge for routing: which backend holds which prompt prefix, in which tier.

- :mod:`.state` — ``PrefixState``: the radix index, routed beliefs, KV-event modes per backend.
- :mod:`.view` — ``PrefixView``: one request's matches per backend and tier, tier credit.
- :mod:`.events`, :mod:`.subscriber`, :mod:`.sources`, :mod:`.blocks` — vLLM KV events: wire
  format, one ZMQ subscription per backend with gap detection, block placement in the tree.
- :mod:`.shared` — kvstack tiers per backend from the index server.
"""
