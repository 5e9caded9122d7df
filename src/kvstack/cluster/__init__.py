"""What makes many hosts one cache: engines report their chunks to the cluster index and lend
their local tiers to each other.

- :mod:`~kvstack.cluster.config` — the ``index`` config section (service, announce, peer).
- :mod:`~kvstack.cluster.announcer` — :class:`Announcer`: a ``KVCache``'s tier events to the
  index service; full syncs on (re)connect.
- :mod:`~kvstack.cluster.peer_server` — :class:`PeerServer`: lends an engine's local tiers over
  TCP (the ``peer://`` tier's protocol, :mod:`kvstack.kv.tiers.peer.protocol`).
- :mod:`~kvstack.cluster.locator` — :class:`IndexLocator`: the ``peer://?index=URL`` tier's
  answer to "which engines hold this chunk", from the index.
- :mod:`~kvstack.cluster.attach` — ``attach_cluster(cache, config)``: what one engine runs.
- :mod:`~kvstack.cluster.peer_cli`, :mod:`~kvstack.cluster.index_cli` — ``kvstack peer-server``
  and ``kvstack index-server``.

Layering: this package imports ``kv`` (the cache, the peer protocol) and ``index`` (its client,
protocol and server); neither imports it (the peer tier finds :class:`IndexLocator` by name).
"""
