"""Imported once by the engine workers' fork server, so that each worker starts with vLLM loaded.

Importing vLLM (and torch and transformers with it) takes about 10 s on two
CPU cores: a sweep of ten engines paid it ten times. The fork server
(:func:`specbench.engine.worker_context`) imports this module once; every
engine worker is then a fork of a process that has already imported vLLM
but has built no engine, started no threads and touched no device.

What the import prints goes to ``$SPECBENCH_ENGINE_LOG`` when it is set, as the
workers' own output does, so the terminal stays quiet.
"""

from __future__ import annotations

import os
from pathlib import Path

from specbench.logs import ENGINE_LOG_ENV, redirect_output

if os.environ.get(ENGINE_LOG_ENV):
    redirect_output(Path(os.environ[ENGINE_LOG_ENV]))

import torch  # noqa: E402,F401
import transformers  # noqa: E402,F401
import vllm  # noqa: E402,F401
import vllm.entrypoints.llm  # noqa: E402,F401
