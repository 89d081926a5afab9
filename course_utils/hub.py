"""Waiting on the Hugging Face hub: how long one hub call may take ($COURSE_HUB_TIMEOUT), no retry warnings
while it waits, and whether a hub model's config is already cached (then no call is needed). Whether the hub
answers at all is data.hub_reachable; models.load_config puts them together. Imports nothing of the course's own.
"""

from __future__ import annotations

import contextlib
import os


HUB_TIMEOUT_ENV = "COURSE_HUB_TIMEOUT"  # seconds the course waits on one hub call (default 20)


def hub_timeout() -> float:
    """The deadline of one hub call, from $COURSE_HUB_TIMEOUT (default 20 s)."""
    try:
        return max(0.1, float(os.environ.get(HUB_TIMEOUT_ENV, "20")))
    except ValueError:
        return 20.0


@contextlib.contextmanager
def _quiet_hub():
    """No retry warnings from huggingface_hub and transformers while we wait (the error says it all)."""
    import logging

    loggers = [logging.getLogger(n) for n in ("huggingface_hub", "transformers")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR + 10)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _in_hub_cache(model_id: str) -> bool:
    """True when a hub model's config is already in the local hub cache."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(model_id, "config.json"), str)
    except Exception:
        return False
