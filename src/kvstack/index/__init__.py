"""The cluster KV index (which engine and tier holds each chunk; ``kvstack index-server``) and
the router's token radix tree. Engines report to it from :mod:`kvstack.cluster`."""
