"""``peer://``: chunks read from other engines' local tiers over TCP.

- :mod:`.tier` — :class:`~kvstack.kv.tiers.peer.tier.PeerTier`: holders per chunk, breakers per
  peer, batched reads.
- :mod:`.client` — :class:`~kvstack.kv.tiers.peer.client.PeerClient`, blocking, receiving
  payloads straight into caller tensors.
- :mod:`.protocol` — the wire format (batched LOOKUP and GET, BUSY back-pressure). The lending
  side, the peer server, is in :mod:`kvstack.cluster` and imports it from here.
- :mod:`.locator` — the ``PeerLocator`` seam: where chunks are (the cluster index answers it).
"""
