"""``s3://``: chunks as objects in S3 or an S3-compatible store.

- :mod:`.tier` — :class:`~kvstack.kv.tiers.s3.tier.S3Tier`.
- :mod:`.s3_url` — URL parameters; :mod:`.s3_io` — ranged reads, multipart uploads, the client.
"""
