"""``kvstack plan``: native vLLM CPU offload, kvstack with local tiers, kvstack with shared tiers,
or neither, for a workload on given hardware, with the numbers behind the answer."""
