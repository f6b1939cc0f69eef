"""Small, pure statistics for summarising timed repetitions and independent engine runs.

Import the module that owns a name (``from specbench.stats import intervals``); this package re-exports nothing.

- :mod:`~specbench.stats.timings`: one timing's summary, within one engine (median, order-statistic interval
  with its exact coverage, CV) and across engine runs (each run counted once); latency percentiles.
- :mod:`~specbench.stats.spreads`: the engine-to-engine spread of log speedups, its degrees of freedom counted
  in independent engines, per batch size or fitted across them.
- :mod:`~specbench.stats.intervals`: a cell's speedup interval, whether its engine runs disagree, and the one
  rule of every "pays" (:func:`~specbench.stats.intervals.clears`).
- :mod:`~specbench.stats.baseline_shifts`: the shifted-baseline test (a baseline engine run that went off alone).
- :mod:`~specbench.stats.distributions`: Student t and chi-square quantiles, computed exactly; the variance of
  a median.
- :mod:`~specbench.stats.acceptance`: the acceptance alpha fitted to per-position rates; looping outputs.

An interval is never reported with zero width for want of data: with one value there is no interval (None),
not the point twice. Everything here is deterministic: the t quantile is computed exactly for integer degrees
of freedom and the order-statistic coverage is an exact binomial sum, so the package needs neither scipy nor
pandas, and it imports nothing else of specbench.
"""
