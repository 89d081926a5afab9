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
import json
import os
import socket
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path

from course_utils.common import SHIPPED_DATA
from course_utils.show.tables import wrap

SHIPPED_PATH: Path = SHIPPED_DATA
DOLLY_HUB_ID = "databricks/databricks-dolly-15k"
FIELDS = ("instruction", "context", "response", "category")


class ShippedDataWarning(UserWarning):
    """The hub data set could not be loaded, so the shipped copy is used (also printed to stderr)."""


SOURCES = ("auto", "hub", "shipped")
_TRUTHY = {"1", "true", "yes", "on"}


def _check_n(n: int | None) -> None:
    """Raise ValueError unless n is None or a positive int."""
    if n is None:
        return
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"n must be a positive int or None (meaning all records), got {n!r}")


def _first(ds: datasets.Dataset, n: int | None) -> datasets.Dataset:
    """Return the first n rows of ds (all of them if n is None or larger)."""
    return ds if n is None else ds.select(range(min(n, len(ds))))


def _read_shipped() -> list[dict[str, str]]:
    """Read the shipped JSON-lines file into a list of dicts."""
    with SHIPPED_PATH.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _offline_mode() -> bool:
    """Return True if HF_HUB_OFFLINE (or HF_DATASETS_OFFLINE) is set to a truthy value."""
    return any(
        os.environ.get(var, "").strip().lower() in _TRUTHY
        for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def hub_address() -> tuple[str, int]:
    """(host, port) of the hub: huggingface.co:443, or where HF_ENDPOINT points (a mirror, a test server)."""
    from urllib.parse import urlsplit

    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


HUB_CHECK_ENV = "COURSE_HUB_CHECK_TIMEOUT"  # seconds the hub check waits to connect, and then for a reply (2)


def hub_check_timeout() -> float:
    """How long hub_reachable waits (to connect, then for the reply): $COURSE_HUB_CHECK_TIMEOUT, default 2 s."""
    try:
        return max(0.01, float(os.environ.get(HUB_CHECK_ENV, "2")))
    except ValueError:
        return 2.0


def hub_answer(timeout: float | None = None) -> tuple[bool, str]:
    """(True, '') when the hub (huggingface.co:443, or HF_ENDPOINT) answers a request within `timeout` seconds to
    connect and as long again to reply; else (False, why): offline mode, no connection, or a connection that
    was accepted and never answered (a proxy or a firewall that holds it open)."""
    if _offline_mode():
        return False, "offline mode is set"
    timeout = hub_check_timeout() if timeout is None else timeout
    from urllib.parse import urlsplit

    host, port = hub_address()
    secure = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").scheme != "http"
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:  # no DNS, refused, timed out, no route...
        return False, f"no connection to {host}:{port} within {timeout:g} s ({type(exc).__name__})"
    try:
        conn.settimeout(timeout)
        if secure:
            import ssl

            conn = ssl.create_default_context().wrap_socket(conn, server_hostname=host)
        conn.sendall(f"HEAD / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        if not conn.recv(1):
            return False, f"{host}:{port} closed the connection without an answer"
        return True, ""
    except (socket.timeout, TimeoutError):
        return False, f"{host}:{port} accepted the connection but did not answer within {timeout:g} s"
    except OSError as exc:  # a TLS failure, a reset
        return False, f"{host}:{port} accepted the connection, then failed ({type(exc).__name__}: {exc})"
    finally:
        conn.close()


def hub_reachable(timeout: float | None = None) -> bool:
    """Return True if the hub (huggingface.co:443, or HF_ENDPOINT) answers a request within `timeout` seconds
    (hub_answer; False at once when offline mode is set, and for a connection accepted and never answered)."""
    LAST_HUB_ANSWER[0] = ""
    ok, LAST_HUB_ANSWER[0] = hub_answer(timeout)
    return ok


LAST_HUB_ANSWER = [""]  # why the last hub_reachable() call found no answer ("" when it did, or none was made)


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


def format_prompt(record: Mapping[str, str]) -> str:
    """Turn one record into training text (Alpaca/dolly layout; no Context block if it is empty)."""
    missing = [field for field in ("instruction", "response") if field not in record]
    if missing:
        raise ValueError(
            f"format_prompt needs the field(s) {missing} but the record only has {sorted(record)}. "
            'Note: the source chapter used dataset_text_field="text", which fails on dolly because '
            'dolly has no "text" column; that is why we build the text with format_prompt.'
        )
    parts = [f"### Instruction:\n{record['instruction'].strip()}"]
    context = (record.get("context") or "").strip()
    if context:
        parts.append(f"### Context:\n{context}")
    parts.append(f"### Response:\n{record['response'].strip()}")
    return "\n\n".join(parts)


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


def corpus_text(n: int | None = None) -> list[str]:
    """Return the formatted texts of the shipped records (the first n if given)."""
    _check_n(n)
    return [format_prompt(r) for r in _read_shipped()[:n]]
