"""Issue 32: bad input is refused before anything trains, in one line, and no traceback reaches the terminal.

Cases 5 (every Recipe field checked for type and range up front, by Recipe and by its flag), 6 (COURSE_HOME a
file or a read-only folder, for every subcommand), 7 (a damaged embedded model: weights, config or tokenizer),
8 (an optimizer step larger than the data), 9 (the store lock: who holds it, since when; a dead holder's is taken),
10 (what a stopped run says), 11 (a hub that accepts and never answers, `course env` in its own process too),
12 (quiz bank placeholders: a restricted evaluator with a deadline) and 13 (every flag of the `course` command,
fed bad values, in process).
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


# --- 5. every Recipe field, type and range, before any process starts -------------------------------------------
BAD_FIELDS = [
    ("lora_alpha", 0), ("lora_alpha", -8), ("lora_alpha", math.nan), ("lora_alpha", math.inf), ("lora_alpha", "big"),
    ("lora_alpha", True), ("double_quant", None), ("double_quant", "yes"), ("load_in_4bit", 1),
    ("gradient_checkpointing", "True"), ("prepare_kbit", 0), ("offload_embeddings", "no"), ("liger_kernels", None),
    ("torch_compile", 1), ("offload_activations", "false"), ("tf32", 0.0), ("optimizer", None), ("optimizer", 3),
    ("precision", None), ("lora_dropout", "0.1"), ("learning_rate", "2e-4"), ("micro_batch", "4"), ("seed", 1.5),
    ("lora_targets", (1, 2)), ("model", None), ("label", 7), ("max_seq_length", None), ("lora_r", 16.0),
    ("steps", 2**31), ("micro_batch", 10**30), ("lora_r", 2**40), ("warmup_steps", 2**63), ("grad_accum", True),
]


@pytest.mark.parametrize("name, value", BAD_FIELDS, ids=[f"{n}={v!r}" for n, v in BAD_FIELDS])
def test_every_recipe_field_is_checked_for_type_and_range(name, value):
    with pytest.raises(RecipeError) as exc:
        Recipe(**{name: value})
    message = str(exc.value)
    assert message.startswith(f"{name} must ") and repr(value)[:20] in message and "\n" not in message
    with pytest.raises(RecipeError) as again:  # a notebook's way: one knob changed on a recipe
        Recipe().with_(**{name: value})
    assert str(again.value) == message


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


@pytest.mark.parametrize("flag, field, value", [
    ("--lr", "learning_rate", "nan"), ("--lr", "learning_rate", "big"), ("--steps", "steps", "0"),
    ("--steps", "steps", "2.5"), ("--steps", "steps", "9" * 30), ("--seed", "seed", "-1"),
    ("--micro-batch", "micro_batch", "four"), ("--grad-accum", "grad_accum", ""),
])
def test_bad_recipe_values_from_the_cli_never_reach_a_process(flag, field, value, no_training, tmp_path):
    """The flag is refused by the same table as Recipe(...), in its words: the field, the value, what is allowed."""
    from course_utils.recipe import FIELD_RULES

    code, _, err = run_cli(["run", f"{flag}={value}", "--store", str(tmp_path / "r.jsonl"),
                            "--out", str(tmp_path / "o")])
    assert code == 2 and not no_training
    line = one_line(err)
    assert line.startswith("course run: error: argument ") and flag in line
    assert f"{field} must {FIELD_RULES[field].allowed}, got " in line and value[:10] in line


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
    monkeypatch.setenv("COURSE_HOME", str(_unusable_home("read-only", tmp_path, monkeypatch)))
    code, _, err = run_cli(argv)
    line = one_line(err)
    assert code == 2 and "Permission denied" in line and "COURSE_HOME" in line


# Every subcommand, with a home it cannot use: those that need COURSE_HOME (to build the tiny model, to keep results)
# refuse in one line that names it; the others work as they do anywhere (a preset's shape needs no home).
NEEDS_HOME = {"run": [["run", "--no-progress"], ["run", "--no-progress", "--gpus", "2"]],
              "estimate": [["estimate", "--model", "tiny"]], "plan": [["plan", "--model", "tiny", "--budget", "1GiB"]]}
NO_HOME = {"env": [["env"]], "estimate": [["estimate"], ["estimate", "--model", "llama-3.1-8b", "--source"]],
           "plan": [["plan", "--model", "llama-3.1-8b", "--budget", "16GiB"]]}


def _unusable_home(kind, tmp_path, monkeypatch):
    """COURSE_HOME as a file, as a folder under a file, or in a read-only folder (simulated as in the test above)."""
    import pathlib

    plain = tmp_path / "plain"
    plain.write_text("not a folder")
    if kind == "file":
        return plain
    if kind == "under a file":
        return plain / "home"
    real_mkdir = pathlib.Path.mkdir

    def mkdir(self, *args, **kwargs):
        if str(self).startswith(str(tmp_path / "read-only")):
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    return tmp_path / "read-only" / "home"


def test_the_home_table_names_every_subcommand():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(NEEDS_HOME) | set(NO_HOME)


@pytest.mark.parametrize("kind", ["file", "under a file", "read-only"])
@pytest.mark.parametrize("argv, needs", [(a, True) for v in NEEDS_HOME.values() for a in v]
                         + [(a, False) for v in NO_HOME.values() for a in v], ids=lambda v: " ".join(v)
                         if isinstance(v, list) else str(v))
def test_every_subcommand_with_a_home_it_cannot_use(argv, needs, kind, no_training, tmp_path, monkeypatch):
    home = _unusable_home(kind, tmp_path, monkeypatch)
    monkeypatch.setenv("COURSE_HOME", str(home))
    if argv[0] == "run":
        argv = [*argv, "--out", str(tmp_path / "out")]
    code, out, err = run_cli(argv)
    assert "Traceback" not in err + out and not no_training
    if needs:
        line = one_line(err)
        assert code == 2 and line.startswith("course: error:") and "COURSE_HOME" in line, line
        assert str(home) in line or "Permission denied" in line, line
    else:
        assert code in (0, 1) and "error" not in err and out.strip(), err  # env is 1 where the stack lacks a part


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


def test_a_garbled_tokenizer_is_found_and_rebuilt_by_the_command(tmp_path, monkeypatch):
    """The whole command: one line says what was damaged and that it is rebuilt, then the answer (a tokenizer cut
    short used to pass the check and end in a JSONDecodeError traceback when the measuring child loaded it)."""
    from course_utils import models

    monkeypatch.setenv("COURSE_HOME", str(tmp_path))
    folder = models.tiny_model_path()
    tokenizer = folder / "tokenizer.json"
    whole = tokenizer.read_bytes()
    tokenizer.write_bytes(whole[:1000])
    code, out, err = run_cli(["estimate", "--model", "tiny"])
    line = one_line(err)
    assert code == 0 and "Estimate for tiny" in out
    assert "damaged" in line and "tokenizer.json cannot be read" in line and "rebuilding" in line
    assert models.damage(folder) is None and tokenizer.read_bytes() == whole


def test_damage_names_a_config_that_does_not_parse(tmp_path):
    from course_utils.models import damage

    (tmp_path / "config.json").write_text('{"hidden_size": 2')
    assert damage(tmp_path).startswith("config.json cannot be read")


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


# --- 9. the store lock: who holds it, since when; a dead holder's lock is taken -----------------------------------
LOCK_HOLDER = """
import sys, time
from pathlib import Path
from course_utils.common import file_lock
with file_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(60)
"""


@pytest.fixture
def lock_holder(tmp_path):
    """A process holding the lock of the store tmp_path/results.jsonl (common.file_lock, as `course run` takes it)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(tmp_path / "results.jsonl.lock")], cwd=root,
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(root)))
    assert holder.stdout.readline().strip() == "held"
    yield holder
    holder.kill()
    holder.wait()
    holder.stdout.close()


def test_a_held_store_lock_says_who_holds_it_and_since_when(lock_holder, tmp_path, monkeypatch, capsys):
    from course_utils.results import ResultStore, StoreError

    from tests.test_store_safety import make

    monkeypatch.setenv("COURSE_LOCK_TIMEOUT", "0.3")
    with pytest.raises(StoreError) as exc:
        ResultStore(tmp_path / "results.jsonl").add(make("waits"))
    waiting = one_line(capsys.readouterr().err)
    today = time.strftime("%Y-%m-%d", time.gmtime())
    for line in (waiting, str(exc.value)):
        assert f"held by pid {lock_holder.pid} since {today} " in line and " UTC (" in line and "-c" in line, line
    assert "up to 0.3 s" in waiting and "after 0.3 s" in str(exc.value)


def test_the_lock_of_a_killed_holder_is_taken_at_once(lock_holder, tmp_path, monkeypatch, capsys):
    """kill -9 leaves the lock file with the dead pid in it; the lock itself went with the process."""
    from course_utils.results import ResultStore

    from tests.test_store_safety import make

    lock_holder.kill()
    lock_holder.wait()
    assert f"pid {lock_holder.pid} " in (tmp_path / "results.jsonl.lock").read_text()
    monkeypatch.setenv("COURSE_LOCK_TIMEOUT", "30")
    started = time.monotonic()
    store = ResultStore(tmp_path / "results.jsonl")
    store.add(make("taken over"))
    assert time.monotonic() - started < 5 and [m.label for m in store.load()] == ["taken over"]
    assert "waiting" not in capsys.readouterr().err


def test_stopped_before_a_result_was_stored_says_so(tmp_path, monkeypatch):
    """Not '0 result(s) of this run were saved in <a store that does not exist>'."""
    from course_utils import cli
    from course_utils.results import ResultStore

    monkeypatch.setitem(cli._STATE, "store", ResultStore(tmp_path / "results.jsonl"))
    monkeypatch.setitem(cli._STATE, "stored_before", 0)
    assert cli._saved_note() == "No result of this run was stored yet; run the same command again to start over."


def test_a_model_build_held_past_the_deadline_names_the_holder_not_course_home(tmp_path, monkeypatch):
    """The tiny model's build lock held by another process: the waiting line, then the deadline's line, with no
    advice to move COURSE_HOME (it is a folder that can be written)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from course_utils import models
    from course_utils.common import lock_path

    monkeypatch.setenv("COURSE_HOME", str(tmp_path))
    monkeypatch.setenv("COURSE_LOCK_TIMEOUT", "0.3")
    target = tmp_path / "models" / f"tiny-llama-{models.tiny_fingerprint()}"
    root = Path(__file__).resolve().parents[1]
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(lock_path(target))], cwd=root,
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(root)))
    try:
        assert holder.stdout.readline().strip() == "held"
        code, _, err = run_cli(["estimate", "--model", "tiny"])
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    waiting, line = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and "Traceback" not in err and waiting.startswith("course: waiting for")
    assert line.startswith("course: error: cannot build the model tiny-llama-") and "COURSE_HOME" not in line
    assert f"held by pid {holder.pid} since " in line and "after 0.3 s" in line


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


def test_course_env_in_its_own_process_ends_and_says_the_hub_did_not_answer(silent_hub):
    """The whole command, as a learner runs it, HF_HUB_OFFLINE unset in its process only: bitsandbytes' import looks
    for a CPU kernel on the hub (on a CPU with AVX512-BF16) with no time limit, and used to hang `course env` here."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update(PYTHONPATH=str(root), COURSE_HUB_CHECK_TIMEOUT="1")
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "course_utils.cli", "env"], cwd=root, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    took = time.monotonic() - started
    hub = [line for line in out.splitlines() if "hub access" in line]
    assert len(hub) == 1 and "did not answer within 1 s" in hub[0], out[-800:] + err[-800:]
    assert "hub access: 127.0.0.1 does not answer" in hub[0]  # the host HF_ENDPOINT names, not huggingface.co
    assert "Traceback" not in err and took < 60


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
    ("no_such_figure * 2", "unknown name 'no_such_figure'"),
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
HUGE = "9" * 30  # past any count a field takes (2**31 - 1) and past int64


def _bad_values(action: argparse.Action) -> list[str]:
    """Values each kind of flag must refuse (or, where argparse takes any text, values that cannot work): its own
    (_kind_values) and, for every flag that takes a value, an empty string."""
    if isinstance(action, argparse.BooleanOptionalAction):
        return ["=yes"]
    if action.nargs == 0:  # --force, --no-progress, --source, --all: a switch given a value
        return ["=1"]
    return list(dict.fromkeys(_kind_values(action) + [""]))


def _kind_values(action: argparse.Action) -> list[str]:
    if action.choices:
        return ["bogus"]
    kind = getattr(action.type, "read", action.type)  # a recipe field's flag reads its type, then checks its rule
    names = {"--budget": ["lots", "-1GiB", "0GiB", "2 x"], "--gpus": ["0", "-2", "two", "2.5"],
             "--seq": ["x", "0", "-64", "99999999", HUGE], "--max-seq-length": ["1.5", "0", HUGE],
             "--lora-r": ["0", "-4", "x", HUGE], "--lora-targets": [",", "bogus_proj"], "--model": ["", "no/such-model"],
             "--optimizer": ["adamw_nope", ""], "--out": ["/dev/null/x"], "--store": ["/"],
             "--warmup-steps": ["x", "-1", "100", HUGE], "--seed": ["x", "-1", "4294967296", HUGE],
             "--lora-dropout": ["x", "nan", "1", "-0.1", "1e400"], "--config": ["/no/such/sft.yaml", "/"],
             "--repeats": ["x", "-1", "2.5", "99", HUGE]}
    for flag in action.option_strings:
        if flag in names:
            return names[flag]
    if kind is int:
        return ["x", "2.5", "-1", "0", HUGE]
    if kind is float:
        return ["x", "nan", "inf", "-1", "0", "1e400"]
    return []


def _table():
    cases = []
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for command, parser in sub.choices.items():
        for action in parser._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            flag = max(action.option_strings, key=len)
            for value in _bad_values(action):
                cases.append((command, flag, value))
    return cases


CASES = _table()
NEEDS = {"plan": ["--model", "tiny", "--budget", "1GiB"], "estimate": ["--model", "tiny"]}


def test_the_table_covers_every_flag():
    flags = {(c, f) for c, f, _ in CASES}
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for command, parser in sub.choices.items():
        for action in parser._actions:
            if action.option_strings and not isinstance(action, argparse._HelpAction):
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
    if value.startswith("="):  # a switch given a value: what a switch takes is said
        assert "a switch takes no value" in line, line
    field = {"--seq": "max_seq_length"}.get(flag, flag[2:].replace("-", "_"))
    assert flag in line or field in line, line  # it names the flag, or the field the flag sets


def test_a_malformed_hub_endpoint_is_one_line_before_the_libraries_load(tmp_path):
    """huggingface_hub parses HF_ENDPOINT while it is imported: the entry point checks it first (course_utils.cli_main)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, HF_ENDPOINT="http://127.0.0.1:99999", COURSE_HOME=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", "import sys; from course_utils import cli_main; "
                          "sys.argv = ['course', 'env']; sys.exit(cli_main())"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert run.stderr.strip() == ("course: error: HF_ENDPOINT='http://127.0.0.1:99999' is not a URL the hub client can "
                                  "use (Port out of range 0-65535); unset it, or set it to a URL such as "
                                  "https://huggingface.co.")
