"""Issue 32: bad input is refused before anything trains, in one line, and no traceback reaches the terminal.

Cases 5 (every Recipe field checked for type and range up front), 6 (COURSE_HOME a file or a read-only
folder), 7 (a damaged embedded model), 8 (an optimizer step larger than the data), 11 (a hub that accepts and
never answers), 12 (quiz bank placeholders: a restricted evaluator with a deadline) and 13 (every flag of the
`course` command, fed bad values, in process).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import socket
import re
import threading
import time

import pytest

from course_utils import measure as measure_mod
from course_utils.cli import build_parser, main
from course_utils.recipe import Recipe, RecipeError


def run_cli(argv, monkeypatch=None) -> tuple[int, str, str]:
    """main(argv) in this process: (exit code, stdout, stderr); argparse's exit is an exit code too."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def no_training(monkeypatch):
    """Fail loudly if anything starts to train: the bad values must be refused before."""
    started = []

    def refuse(*args, **kwargs):
        started.append(args)
        raise AssertionError("a training run started")

    monkeypatch.setattr(measure_mod, "_run_child", refuse)
    monkeypatch.setattr(measure_mod, "run_here", refuse)
    return started


# --- 5. every Recipe field, type and range, before any process starts -------------------------------------------
BAD_FIELDS = [
    ("lora_alpha", 0), ("lora_alpha", -8), ("lora_alpha", math.nan), ("lora_alpha", math.inf), ("lora_alpha", "big"),
    ("lora_alpha", True), ("double_quant", None), ("double_quant", "yes"), ("load_in_4bit", 1),
    ("gradient_checkpointing", "True"), ("prepare_kbit", 0), ("offload_embeddings", "no"), ("liger_kernels", None),
    ("torch_compile", 1), ("offload_activations", "false"), ("tf32", 0.0), ("optimizer", None), ("optimizer", 3),
    ("precision", None), ("lora_dropout", "0.1"), ("learning_rate", "2e-4"), ("micro_batch", "4"), ("seed", 1.5),
    ("lora_targets", (1, 2)), ("model", None), ("label", 7), ("max_seq_length", None), ("lora_r", 16.0),
]


@pytest.mark.parametrize("name, value", BAD_FIELDS, ids=[f"{n}={v!r}" for n, v in BAD_FIELDS])
def test_every_recipe_field_is_checked_for_type_and_range(name, value):
    with pytest.raises(RecipeError) as exc:
        Recipe(**{name: value})
    message = str(exc.value)
    assert message.startswith(f"{name} must ") and repr(value)[:20] in message and "\n" not in message


def test_one_table_holds_every_field_and_validate_reads_it():
    import dataclasses

    from course_utils.recipe import FIELD_RULES

    assert set(FIELD_RULES) == {f.name for f in dataclasses.fields(Recipe)}
    for name, rule in FIELD_RULES.items():
        assert rule.ok(getattr(Recipe(), name)), name  # the defaults are allowed
        assert rule.kind in ("bool", "whole", "number", "text", "choice", "names")


def test_the_keys_of_shipped_results_are_unchanged():
    """The table checks; it converts nothing: every shipped result still reads back, under its stored key."""
    from course_utils.results import all_reference_results

    ms = all_reference_results()
    assert len(ms) > 30 and all(m.recipe_obj.key == m.recipe_key for m in ms)


@pytest.mark.parametrize("flag, value", [("--lr", "nan"), ("--steps", "0"), ("--seed", "-1")])
def test_bad_recipe_values_from_the_cli_never_reach_a_process(flag, value, no_training, tmp_path):
    code, _, err = run_cli(["run", flag, value, "--store", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "o")])
    assert code == 2 and not no_training
    assert one_line(err).startswith("course: error:")


# --- 6. COURSE_HOME a file or a read-only folder -------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["estimate", "--model", "tiny"], ["plan", "--model", "tiny", "--budget", "1GiB"]])
def test_course_home_that_is_a_file(argv, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.write_text("not a folder")
    monkeypatch.setenv("COURSE_HOME", str(home))
    code, _, err = run_cli(argv)
    line = one_line(err)
    assert code == 2 and "COURSE_HOME" in line and str(home) in line


@pytest.mark.parametrize("argv", [["estimate", "--model", "tiny"], ["plan", "--model", "tiny", "--budget", "1GiB"]])
def test_course_home_in_a_read_only_folder(argv, tmp_path, monkeypatch):
    """Simulated (the tests may run as root, who writes anywhere): making a folder there is refused."""
    import pathlib

    home = tmp_path / "read-only" / "home"
    real_mkdir = pathlib.Path.mkdir

    def mkdir(self, *args, **kwargs):
        if str(self).startswith(str(tmp_path / "read-only")):
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    monkeypatch.setenv("COURSE_HOME", str(home))
    code, _, err = run_cli(argv)
    line = one_line(err)
    assert code == 2 and "Permission denied" in line and "COURSE_HOME" in line


# --- 7. a damaged embedded model ---------------------------------------------------------------------------------
def test_a_truncated_tiny_model_is_found_and_rebuilt(tmp_path, monkeypatch, capsys):
    from course_utils import models

    monkeypatch.setenv("COURSE_HOME", str(tmp_path))
    folder = models.tiny_model_path()
    weights = folder / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 3])  # a copy that stopped, a full disk
    assert "cut short" in models.damage(folder)
    capsys.readouterr()
    again = models.tiny_model_path()
    assert again == folder and models.damage(folder) is None and weights.read_bytes() == whole
    said = one_line(capsys.readouterr().err)
    assert "damaged" in said and "rebuilding" in said


def test_damage_names_a_missing_config_or_weights(tmp_path):
    from course_utils.models import damage

    assert "config.json" in damage(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    assert "no weights" in damage(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 64)
    assert "model.safetensors" in damage(tmp_path)


# --- 8. an optimizer step that needs more data than there is -----------------------------------------------------
def test_grad_accum_beyond_the_data_is_refused_up_front(tiny_model, no_training, tmp_path):
    from course_utils.models import shipped_token_count

    started = time.monotonic()
    code, _, err = run_cli(["run", "--grad-accum", "1000", "--store", str(tmp_path / "r.jsonl"),
                            "--out", str(tmp_path / "o"), "--no-progress"])
    line = one_line(err)
    blocks = shipped_token_count() // 256
    assert code == 2 and not no_training and time.monotonic() - started < 60
    assert "4 x 1000 = 4000 sequences" in line and f"at most {blocks}" in line


# --- 11. a hub that accepts connections and never answers ---------------------------------------------------------
@pytest.fixture
def silent_hub(monkeypatch):
    """A local server that accepts every connection and never sends a byte."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    worker = threading.Thread(target=accept, daemon=True)
    worker.start()
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
    monkeypatch.setenv("COURSE_HUB_CHECK_TIMEOUT", "0.3")
    yield server
    stop.set()
    worker.join()
    for conn in held:
        conn.close()
    server.close()


def test_a_hub_that_never_answers_is_not_reachable(silent_hub):
    from course_utils import data

    started = time.monotonic()
    ok, why = data.hub_answer()
    assert not ok and "accepted the connection but did not answer within 0.3 s" in why
    assert data.hub_reachable() is False
    assert time.monotonic() - started < 5


def test_course_env_says_the_hub_did_not_answer(silent_hub):
    from course_utils.cli_env import env_report

    text, _ = env_report()
    hub = [line for line in text.splitlines() if "hub access" in line]
    assert len(hub) == 1 and "did not answer within 0.3 s" in hub[0] and "answers" not in hub[0].split(":")[1]


# --- 12. quiz bank placeholders ------------------------------------------------------------------------------------
def bank_with(tmp_path, expression: str):
    path = tmp_path / "99_bad.yaml"
    path.write_text(f"title: A bad bank\nquestions:\n  - id: q-bad\n    prompt: |\n      How big is {{{{ {expression} }}}}?\n"
                    "    choices:\n      - {text: one, correct: true, why: because}\n"
                    "      - {text: two, why: not}\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("expression, why", [
    ("9**9**9", "exponent"),
    ("().__class__.__bases__", "'_'"),
    ("'{0.__class__}'.format(1)", "format"),
    ("open('/etc/passwd').read()", "unknown name 'open'"),
    ("'x' * 10**6", "repetition"),
    ("(lambda: 1)()", "Lambda"),
])
def test_a_bad_placeholder_is_refused_at_once_naming_bank_question_and_placeholder(tmp_path, expression, why):
    from course_utils.chapter.quiz.bank import QuizError, load_bank

    path, box = bank_with(tmp_path, expression), {}

    def load():
        try:
            load_bank(path)
        except QuizError as exc:
            box["error"] = exc

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the loader hangs on the placeholder"
    message = str(box["error"])
    # a bank renders from the shipped values: a word that is not a named figure is refused before anything runs;
    # what gets past the names (9**9**9, a format call, a repetition) is refused by the evaluator
    refused = why in message or "not named figures" in message
    assert str(path) in message and "'q-bad'" in message and expression in message and refused, message
    # the sources' own path (facts.render_value: README, notebooks) refuses it in the evaluator, with its reason
    from course_utils.chapter.facts import FactError, render_value

    with pytest.raises(FactError, match=re.escape(why)):
        render_value(expression)


def test_the_evaluator_keeps_what_the_texts_use():
    from course_utils.safe_eval import evaluate

    names = {"f": lambda x, y=1: x * y, "GiB": 2**30, "items": [1, 2, 3]}
    assert evaluate("f(3, y=2) / 2 + 2**10 - GiB / GiB", names) == 3 + 1024 - 1
    assert evaluate("sum(x for x in items if x > 1)", {**names, "sum": sum}) == 5
    assert evaluate("items[-1] if 'a' in 'abc' else 0", names) == 3
    with pytest.raises(ValueError, match="took longer"):
        evaluate("sum(x for x in items)", {"sum": sum, "items": range(10**9)}, seconds=0.2)


# --- 13. no traceback from the `course` command, for any flag's bad value -----------------------------------------
def _bad_values(action: argparse.Action) -> list[str]:
    """Values each kind of flag must refuse (or, where argparse takes any text, values that cannot work)."""
    if isinstance(action, argparse.BooleanOptionalAction):
        return ["=yes"]
    if action.choices:
        return ["bogus"]
    kind = action.type
    names = {"--budget": ["lots", "-1GiB", "0GiB", "2 x"], "--gpus": ["0", "-2", "two"],
             "--seq": ["x", "0", "-64", "99999999"], "--max-seq-length": ["1.5", "0"],
             "--lora-r": ["0", "-4", "x"], "--lora-targets": [",", "bogus_proj"], "--model": ["", "no/such-model"],
             "--optimizer": ["adamw_nope", ""], "--out": ["/dev/null/x"], "--store": ["/"],
             "--warmup-steps": ["x", "-1", "100"], "--seed": ["x", "-1", "4294967296"],
             "--lora-dropout": ["x", "nan", "1", "-0.1"], "--config": ["/no/such/sft.yaml", "/"],
             "--repeats": ["x", "-1", "2.5", "99"]}
    for flag in action.option_strings:
        if flag in names:
            return names[flag]
    if kind is int:
        return ["x", "2.5", "-1", "0"]
    if kind is float:
        return ["x", "nan", "inf", "-1", "0"]
    return []


def _table():
    cases = []
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for command, parser in sub.choices.items():
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0 and not isinstance(action,
                                                                                 argparse.BooleanOptionalAction):
                continue
            flag = max(action.option_strings, key=len)
            for value in _bad_values(action):
                cases.append((command, flag, value))
    return cases


CASES = _table()
NEEDS = {"plan": ["--model", "tiny", "--budget", "1GiB"], "estimate": ["--model", "tiny"]}


def test_the_table_covers_every_flag_that_takes_a_value():
    flags = {(c, f) for c, f, _ in CASES}
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for command, parser in sub.choices.items():
        for action in parser._actions:
            if action.option_strings and (action.nargs != 0 or isinstance(action, argparse.BooleanOptionalAction)):
                assert (command, max(action.option_strings, key=len)) in flags, (command, action.option_strings)
    assert len(CASES) > 80


@pytest.mark.parametrize("command, flag, value", CASES, ids=[f"{c} {f} {v!r}" for c, f, v in CASES])
def test_every_bad_flag_value_is_one_line_and_no_traceback(command, flag, value, tiny_model, no_training, tmp_path,
                                                           monkeypatch):
    monkeypatch.setenv("COURSE_HUB_TIMEOUT", "1")
    argv = [command, f"{flag}{value}" if value.startswith("=") else f"{flag}={value}"]
    base = {"run": ["--store", str(tmp_path / "r.jsonl"), "--out", str(tmp_path / "o"), "--no-progress"],
            **NEEDS}.get(command, [])
    argv += [a for i, a in enumerate(base) if not (a == flag or (i and base[i - 1] == flag))]
    code, out, err = run_cli(argv)
    assert code != 0, (argv, out[-500:])
    line = one_line(err)
    assert "error" in line and not no_training, argv
    assert "Traceback" not in out
