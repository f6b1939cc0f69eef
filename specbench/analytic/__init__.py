"""The analytic side: what the roofline-decay model predicts, apart from what is measured.

- :mod:`~specbench.analytic.theory`: the model itself, pure Python: expected
  tokens per target pass, step times on a hardware profile, engine memory;
- :mod:`~specbench.analytic.calibrate`: fits a machine's hardware profile to
  timed engine steps (``python -m specbench.analytic.calibrate``);
- :mod:`~specbench.analytic.prediction`: prices a sweep's cells with the model
  and compares (``python -m specbench.analytic.prediction <sweep>``);
- :mod:`~specbench.analytic.memory`: what a cell's engine and drafter take in memory;
- :mod:`~specbench.analytic.plan`: a grid's cells priced before any engine
  starts (``python -m specbench.analytic.plan``);
- :mod:`~specbench.analytic.recommend`: the best K per batch-size range from
  measured cells (``python -m specbench.analytic.recommend <sweep>``).

Nothing here imports vLLM: calibration starts its engines through
:mod:`specbench.engine`, like a sweep.
"""
