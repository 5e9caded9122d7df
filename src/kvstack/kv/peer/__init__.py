"""Peer-to-peer KV: an engine lends the chunks of its local tiers to other engines over TCP.

- :mod:`~kvstack.kv.tiers.peer.protocol` — the wire format (batched lookup and get).
- :mod:`~kvstack.kv.peer.server` — :class:`PeerServer`, asyncio, embedded in an engine process
  or run alone by ``kvstack peer-server``.
- :mod:`~kvstack.kv.tiers.peer.client` — :class:`PeerClient`, blocking, receiving payloads straight
  into caller tensors; used by the ``peer://`` tier (:mod:`kvstack.kv.tiers.peer.tier`).
"""
