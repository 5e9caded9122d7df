"""Talking to the backends: the proxied data path (httptools connections, pools, the relay) and the
control-plane client (httpx)."""
