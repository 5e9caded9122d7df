"""``kvstack up`` / ``down``: a local stack of engines, router, index and redis as supervised
processes."""
