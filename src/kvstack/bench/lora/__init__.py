"""``kvstack bench lora``: the adapter-cache benchmark, kvstack's weighted policy against LRU
with the same never-evict pins and against plain LRU.

:mod:`~kvstack.bench.lora.cli` parses the flags and runs every arm
(:mod:`~kvstack.bench.lora.arms`) on every workload (:mod:`~kvstack.bench.lora.seeds`): on
simulated engines (:mod:`~kvstack.bench.lora.sim_mode`, one arm in
:mod:`~kvstack.bench.lora.run_sim`, fixtures in :mod:`~kvstack.bench.lora.setup`) or as
discrete events (:mod:`~kvstack.bench.lora.des_mode`, :mod:`~kvstack.bench.lora.des`);
:mod:`~kvstack.bench.lora.report` turns their records into figures and
:mod:`~kvstack.bench.lora.report_md` the committed results into the published tables.
"""
