"""The course's named figures: one registry (figures.yaml) that every text pins by name, and their shipped values.

A quiz bank, a notebook's Markdown or the README writes a figure as `{{ name :format }}` (or pins it,
`2.90<!--{{ ref_source_allocated_gib :.2f }}-->`), where `name` is an entry of `figures.yaml`: a snake_case
name, the one expression over course_utils.chapter.facts' sources that gives it, and a line saying what it is.
A placeholder may do arithmetic over names (`{{ (tiny_baseline_peak - tiny_ckpt_peak) / MiB :.1f }}`), and
nothing else: the same figure is typed once, here, however many texts state it.

`course_utils/reference/facts.json` holds every name's value, rendered from the sources by
`python -m course_utils.chapter.facts --write`, so that checking prose needs no torch
(`with facts.from_shipped(): ...`); tests/test_named_figures.py fails when the file is stale.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from contextlib import contextmanager
from dataclasses import dataclass

from course_utils.common import GiB, MiB, shipped
from course_utils.safe_eval import evaluate

REGISTRY = shipped("chapter", "figures.yaml")
VALUES = shipped("reference", "facts.json")
COMMAND = "python -m course_utils.chapter.facts --write"
NAME = re.compile(r"[a-z][a-z0-9_]*")
# what a placeholder may use besides the names: units and plain arithmetic (the rest lives in the registry)
ARITHMETIC = dict(MiB=MiB, GiB=GiB, mib=lambda x: x / MiB, gib=lambda x: x / GiB, round=round, min=min, max=max,
                  abs=abs)


@dataclass(frozen=True)
class Figure:
    """One named figure: the expression that gives it (over facts.namespace()) and what it is."""

    name: str
    expr: str
    about: str


@functools.lru_cache(maxsize=None)
def registry() -> dict[str, Figure]:
    """Every named figure of figures.yaml, by name."""
    import yaml

    data = yaml.safe_load(REGISTRY.read_text(encoding="utf-8"))
    bad = [n for n in data if not NAME.fullmatch(n) or n in ARITHMETIC]
    if bad:
        raise ValueError(f"{REGISTRY.name}: names must be snake_case and not a unit or builtin: {bad}")
    return {n: Figure(n, " ".join(e["expr"].split()), e["about"]) for n, e in data.items()}


def digest() -> str:
    """The registry file's SHA-256: facts.json records the one it was rendered from."""
    return hashlib.sha256(REGISTRY.read_bytes()).hexdigest()


@functools.lru_cache(maxsize=None)
def shipped_values() -> dict:
    """The shipped values of every named figure (course_utils/reference/facts.json), by name."""
    return json.loads(VALUES.read_text(encoding="utf-8"))["figures"]


def values_file(values: dict) -> str:
    """facts.json's text for these values: how it was made, from which registry, and the figures."""
    return json.dumps({"about": "The value of every named figure of course_utils/chapter/figures.yaml, rendered "
                                "from the shipped reference runs and the course's estimator; texts are checked "
                                "against it without torch.",
                       "command": COMMAND, "registry_sha256": digest(), "figures": values},
                      indent=1, ensure_ascii=False) + "\n"


def stale(values: dict) -> list[str]:
    """What differs between these (freshly rendered) values and the shipped file: one line each."""
    shipped_now = json.loads(VALUES.read_text(encoding="utf-8")) if VALUES.exists() else {"figures": {}}
    problems = [] if shipped_now.get("registry_sha256") == digest() else [f"{REGISTRY.name} changed since {VALUES.name} was written"]
    old = shipped_now["figures"]
    problems += [f"{n}: shipped {old.get(n, 'nothing')!r}, now {values.get(n, 'nothing')!r}"
                 for n in sorted(set(old) | set(values)) if old.get(n) != values.get(n)]
    return problems


_SHIPPED = []  # non-empty inside from_shipped()
_WORD = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")


@contextmanager
def from_shipped():
    """Placeholders rendered inside this block take the names' values from facts.json, and may use nothing but
    names, units and arithmetic: how prose is checked without torch (the sources are never imported)."""
    _SHIPPED.append(True)
    try:
        yield
    finally:
        _SHIPPED.pop()


def names_for(expression: str, namespace) -> dict:
    """The names a placeholder's expression may use: the named figures it mentions (from the sources, or from
    facts.json inside from_shipped()), with `namespace()` (facts.namespace) outside it."""
    words = set(_WORD.findall(re.sub(r"'[^']*'|\"[^\"]*\"", "", expression)))
    used = words & registry().keys()
    if _SHIPPED:
        unknown = sorted(words - used - ARITHMETIC.keys())
        if unknown:
            raise ValueError(f"{unknown} in {{{{ {expression} }}}} {'is' if len(unknown) == 1 else 'are'} not named "
                             f"figures of {REGISTRY.name}: texts pin figures by name (scripts/notebooks/name_figures.py "
                             f"names it, or add it there and run {COMMAND})")
        missing = sorted(used - shipped_values().keys())
        if missing:
            raise ValueError(f"{missing} not in {VALUES.name}: run {COMMAND}")
        return {**ARITHMETIC, **{n: shipped_values()[n] for n in used}}
    names = namespace()
    names.update({n: evaluate(registry()[n].expr, names) for n in used})
    return names


# --- rendering ------------------------------------------------------------------------------------
PLACEHOLDER = re.compile(r"\{\{(.+?)\}\}", re.S)
_SPEC = re.compile(r"^(.*\S)\s*:\s*([<>^=+\- #0-9,._%a-zA-Z]*)$", re.S)


class FactError(ValueError):
    """A placeholder that cannot be rendered: names the expression and what went wrong."""


def render_value(expression: str, namespace=None):
    """Evaluate one placeholder's expression (and format it, when it carries a spec). `namespace`: the sources'
    names (facts.namespace, which facts.render_value passes); None: the shipped values of facts.json, as a quiz
    bank renders (no torch, no source imported; tests/test_named_figures.py keeps the file current)."""
    expr, spec = expression.strip(), None
    found = _SPEC.match(expr)
    if found and "(" not in found.group(2):
        expr, spec = found.group(1), found.group(2)
    try:
        if namespace is None:
            with from_shipped():
                value = evaluate(expr, names_for(expr, None))
        else:
            value = evaluate(expr, names_for(expr, namespace))  # restricted (safe_eval), with named figures
    except FactError:
        raise
    except Exception as exc:
        raise FactError(f"{{{{ {expression.strip()} }}}}: {type(exc).__name__}: {exc}") from None
    return format(value, spec) if spec is not None else value


def _shown(value) -> str:
    """A placeholder's value as text shows it: strings as they are, integers with thousands separators."""
    return value if isinstance(value, str) else f"{value:,}" if isinstance(value, int) else str(value)


def render(text: str, namespace=None) -> str:
    """Every placeholder in `text` replaced by its value."""
    return PLACEHOLDER.sub(lambda match: _shown(render_value(match.group(1), namespace)), text)


def render_tree(data, namespace=None):
    """render() applied to every string of parsed YAML; a string that is one placeholder keeps its value's type."""
    if isinstance(data, dict):
        return {k: render_tree(v, namespace) for k, v in data.items()}
    if isinstance(data, list):
        return [render_tree(v, namespace) for v in data]
    if isinstance(data, str):
        whole = PLACEHOLDER.fullmatch(data.strip())
        if whole:
            value = render_value(whole.group(1), namespace)
            return value if isinstance(value, (int, float)) else str(value)
        return render(data, namespace) if "{{" in data else data
    return data
