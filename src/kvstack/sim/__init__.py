"""A simulated vLLM engine: vLLM's HTTP API, metrics and KV events over a paged KV model in
scaled time, so fleets of engines run on a laptop (``kvstack sim-engine``)."""
