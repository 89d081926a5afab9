"""Instruction data for the fine-tuning chapters.

The chapters fine-tune on databricks-dolly-15k, a set of instruction records
with four text fields: ``instruction``, ``context``, ``response`` and
``category``. Downloading it needs the Hugging Face hub, which is not always
reachable (offline laptops, firewalled classrooms, CI). So this package also
ships 1,200 small, templated records with exactly the same fields, written by
``scripts/data/make_instructions.py`` (see ``data/LICENSE-instructions.md``).

Typical use::

    from course_utils.data import load_instructions, to_text_dataset

    ds = load_instructions("dolly", n=500)   # the hub if reachable, else the shipped copy
    print(ds.info.description)               # "source: hub" or "source: shipped"
    train = to_text_dataset(ds)              # one "text" column, ready for SFTTrainer

Which source was used is recorded in ``ds.info.description``: it is exactly
``"source: hub"`` or ``"source: shipped"``.
"""

from __future__ import annotations

import datasets
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path

from course_utils.common import SHIPPED_DATA, _check_n, _read_shipped, corpus_text, format_prompt  # noqa: F401
from course_utils.hub import (HUB_CHECK_ENV, LAST_HUB_ANSWER, _offline_mode, hub_address, hub_answer,  # noqa: F401
                              hub_check_timeout, hub_reachable)
from course_utils.show.tables import wrap

SHIPPED_PATH: Path = SHIPPED_DATA
DOLLY_HUB_ID = "databricks/databricks-dolly-15k"
FIELDS = ("instruction", "context", "response", "category")


class ShippedDataWarning(UserWarning):
    """The hub data set could not be loaded, so the shipped copy is used (also printed to stderr)."""


SOURCES = ("auto", "hub", "shipped")
def _first(ds: datasets.Dataset, n: int | None) -> datasets.Dataset:
    """Return the first n rows of ds (all of them if n is None or larger)."""
    return ds if n is None else ds.select(range(min(n, len(ds))))


def load_shipped(n: int | None = None) -> datasets.Dataset:
    """Return the shipped offline records (the first n if given), columns in FIELDS order."""
    _check_n(n)
    records = _read_shipped()[:n]
    columns = {field: [r[field] for r in records] for field in FIELDS}
    info = datasets.DatasetInfo(description="source: shipped")
    return datasets.Dataset.from_dict(columns, info=info)


def _load_hub(n: int | None) -> datasets.Dataset:
    """Download dolly from the hub and keep the first n rows and the FIELDS columns."""
    ds = datasets.load_dataset(DOLLY_HUB_ID, split="train")
    ds = _first(ds, n).select_columns(list(FIELDS))
    ds.info.description = "source: hub"
    return ds


def _describe(exc: Exception) -> str:
    """Return "TypeName: first line of the message" (shortened) for one exception."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__


def _fallback(reason: str, n: int | None, chosen: bool = False) -> datasets.Dataset:
    """Warn that the hub is not used, then return the shipped records. The message is printed to stderr when
    the hub failed, and as a plain note on stdout when offline mode was chosen (HF_HUB_OFFLINE: CI, the
    embedded default), which is no error: a notebook then shows no red warning box for it."""
    message = (
        f"Could not reach the Hugging Face hub for {DOLLY_HUB_ID} ({reason}); "
        f"using the {len(_read_shipped()):,} shipped offline examples instead "
        f"(course_utils/data/{SHIPPED_PATH.name})."
    )
    warnings.warn(message, ShippedDataWarning, stacklevel=3)
    print(wrap(message), file=sys.stdout if chosen else sys.stderr)
    return load_shipped(n)


def load_instructions(
    name: str = "dolly", n: int | None = None, *, source: str = "auto"
) -> datasets.Dataset:
    """Load dolly: source="auto" tries the hub, then the shipped copy; "hub"/"shipped" pick one."""
    if name != "dolly":
        raise ValueError(f"Unknown instruction data set {name!r}; the only valid name is 'dolly'.")
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    _check_n(n)

    if source == "shipped":
        return load_shipped(n)

    if source == "hub":
        hint = 'use load_instructions("dolly", source="shipped") for the offline copy.'
        if not hub_reachable():
            raise RuntimeError(
                f"The Hugging Face hub could not be reached for {DOLLY_HUB_ID}; {hint}"
            )
        try:
            return _load_hub(n)
        except Exception as exc:
            raise RuntimeError(
                f"Loading {DOLLY_HUB_ID} from the hub failed ({type(exc).__name__}); {hint}"
            ) from exc

    # source == "auto": try the hub, fall back to the shipped copy.
    if not hub_reachable():
        chosen = _offline_mode()
        return _fallback("HF_HUB_OFFLINE is set" if chosen else "huggingface.co:443 did not answer", n, chosen)
    try:
        return _load_hub(n)
    except Exception as exc:
        return _fallback(_describe(exc), n)


def _text_column(record: Mapping[str, str]) -> dict[str, str]:
    """Map one record to {"text": formatted prompt}."""
    return {"text": format_prompt(record)}


def to_text_dataset(ds: datasets.Dataset) -> datasets.Dataset:
    """Return a dataset with a single "text" column built with format_prompt. Formatted once per distinct input
    in a process (keyed by its content fingerprint): every build of a recipe formats the same records."""
    key = getattr(ds, "_fingerprint", None)
    text = _TEXT_DATASETS.get(key) if key else None
    if text is None:
        text = ds.map(_text_column, remove_columns=ds.column_names, desc="Formatting prompts")
        if key:
            _TEXT_DATASETS[key] = text
    return text


_TEXT_DATASETS: dict[str, datasets.Dataset] = {}  # to_text_dataset: fingerprint -> result (never changed in place)
