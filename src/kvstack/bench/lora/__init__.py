"""``kvstack bench lora``: the adapter-cache benchmark, weighted hotness against LRU.

:mod:`~kvstack.bench.lora.cli` parses the flags and runs the arms: the simulator arms
(:mod:`~kvstack.bench.lora.run_sim`, on fixtures from :mod:`~kvstack.bench.lora.setup`) and the
discrete-event arms (:mod:`~kvstack.bench.lora.des`); :mod:`~kvstack.bench.lora.report` turns
their records into figures.
"""
