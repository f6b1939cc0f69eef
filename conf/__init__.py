"""specbench's Hydra configs (installed as ``specbench.conf``).

Importing the package registers the schema conf/config.yaml names first in
its defaults (``specbench_schema``), so every way of composing these configs
(the app, ``hydra.compose``, the plan and calibration commands) type-checks.
"""

import specbench.config  # noqa: F401  (registers specbench_schema)
