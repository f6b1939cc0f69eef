"""Setting environment variables for the length of a call, then putting them back."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


@contextmanager
def patched_environ(values: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` updated with ``values`` inside the block; each key restored (or removed) after it."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
