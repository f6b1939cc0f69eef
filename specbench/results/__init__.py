"""Results as Parquet: one module per concern.

- :mod:`~specbench.results.schema`: the row format (:data:`~specbench.results.schema.SCHEMA`,
  its version) and one rule each for reading rows (a sweep's file, a row's
  config, the curve a row belongs to, whether it may be recommended);
- :mod:`~specbench.results.provenance`: versions, host, and the machine's
  state around a measurement (other processes' CPU time, GPU clocks);
- :mod:`~specbench.results.metrics`: one cell's measured columns from its
  repetitions and vLLM's counters;
- :mod:`~specbench.results.rows`: the one row builder (a cell's identity,
  provenance, measurement, engine and memory) and the one speedup computation;
- :mod:`~specbench.results.merge`: a sweep's cell files into one row per
  cell, each speculative cell compared with its baseline and flagged where
  its numbers need care;
- :mod:`~specbench.results.files`: the one atomic writer every file goes
  through, and where one cell's files live.
"""
