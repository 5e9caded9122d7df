"""``file://``: one file per chunk on local disk.

- :mod:`.tier` — :class:`~kvstack.kv.tiers.file.tier.FileTier`: background writes, reads, the
  index rebuilt at start.
- :mod:`.file_url` — URL parameters.
- :mod:`.file_index` — the chunks known on disk, their sizes, eviction order and byte budget.
- :mod:`.chunkfile` — one chunk file: atomic writes, verified reads, the directory scan.
"""
