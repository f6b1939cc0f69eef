"""The analytic side: what the roofline-decay model predicts, apart from what is measured.

The model, pure standard-library Python, read in this order:

- :mod:`~specbench.analytic.acceptance`: tokens per target pass, E(alpha, K);
- :mod:`~specbench.analytic.profiles`: what a pass costs (hardware and model profiles);
- :mod:`~specbench.analytic.steps`: the roofline price of decode, verification and prefill passes;
- :mod:`~specbench.analytic.drafting`: what the drafter spends;
- :mod:`~specbench.analytic.speedup`: predicted speedups and the decisions drawn from them;
- :mod:`~specbench.analytic.footprint`: engine memory, and whether a batch fits;
- :mod:`~specbench.analytic.profile_fit`: a hardware profile fitted to measured step times.

Applied to configs and result rows:

- :mod:`~specbench.analytic.prediction`: prices a sweep's cells and compares
  (``python -m specbench.analytic.prediction <sweep>``);
- :mod:`~specbench.analytic.memory`: what a cell's engine and drafter take in memory;
- :mod:`~specbench.analytic.recommend`: the best K per batch-size range from
  measured cells (``python -m specbench.analytic.recommend <sweep>``).

Nothing here measures: no engine, no config composition, no sweep. The
measuring side (:mod:`specbench.calibrate`, :mod:`specbench.plan`, the
sweep) calls in; nothing here calls out.
"""
