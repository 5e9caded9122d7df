"""``cpu://``: chunks in DRAM (:mod:`.tier`), carved from one byte arena (:mod:`.arena`)."""
