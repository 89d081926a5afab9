"""Every notebook's "Try it" exercise (course_utils/chapter/exercises.py, scripts/notebooks/write_notebooks.py exercises): each worked
solution passes its own check on the tiny model's base recipe, a wrong answer fails with the estimated figures
that decided it, the task texts hold no typed figure, and the insert script is idempotent on a copy of the
notebooks. Estimator only (the tiny model's estimate is exact on this CPU, tests/test_estimate.py): no training.
"""

from __future__ import annotations

import ast
import html
import dataclasses
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from course_utils.chapter import exercises as X
from course_utils.chapter import facts
from course_utils.chapter.exercises import (EXERCISES, ExerciseError, check_exercise, exercise, show_exercise,
                                            show_solution)
from course_utils.common import MiB
from course_utils.recipe import Recipe, source_chapter_recipe
from course_utils.show.tables import WIDTH

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
LLAMA = "llama-3.1-8b"


@pytest.fixture(scope="module")
def base(tiny_model) -> Recipe:
    """The base recipe notebooks 00-07 use on a CPU: base_recipe(choose_model()) is this on the embedded model."""
    from course_utils.recipe import base_recipe_for

    return base_recipe_for("tiny", "cpu")


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("write_notebooks", ROOT / "scripts" / "notebooks" / "write_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_notebook_has_an_exercise():
    """Every notebook but those WITHOUT_EXERCISE names (with the reason) has one, and those have no Try it cell."""
    from course_utils.chapter.exercises import WITHOUT_EXERCISE

    assert NOTEBOOKS
    assert sorted(EXERCISES) == [p.stem for p in NOTEBOOKS if p.stem not in WITHOUT_EXERCISE]
    assert set(WITHOUT_EXERCISE) <= {p.stem for p in NOTEBOOKS} and all(WITHOUT_EXERCISE.values())
    for p in NOTEBOOKS:
        if p.stem in WITHOUT_EXERCISE:
            assert "show_exercise(" not in p.read_text(), p.name


@pytest.mark.parametrize("name", list(EXERCISES))
def test_the_worked_solution_passes_its_check(base, name):
    ex = exercise(name)
    verdict = ex.check(ex.solution(base, "cpu"), base, "cpu")
    assert verdict.passed, str(verdict)
    assert verdict.lines and any(unit in " ".join(verdict.lines) for unit in ("MiB", "GiB")), str(verdict)


def _run_cell(source: str, base: Recipe):
    """What an answer cell leaves in `answer` when it runs (its library objects)."""
    import warnings

    scope = {"base": base}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(source, "<answer cell>", "exec"), scope)
    return scope["answer"]


@pytest.mark.parametrize("name", list(EXERCISES))
def test_no_answer_checks_the_worked_solution_and_hides_it(base, name):
    ex = exercise(name)
    unfilled = _run_cell(ex.answer_cell(base, "cpu"), base)  # the answer cell as committed, run
    for answer, says in ((None, "no answer yet"), (unfilled, "nothing changed yet")):
        verdict = check_exercise(name, answer, base, "cpu")
        assert not verdict.passed  # no answer is not a right answer
        text = str(verdict)
        assert text.startswith(f"Not yet: {says}") and "change the lines marked `# <- ?`" in " ".join(text.split())
        assert "the worked solution passes this check here" in text
        assert ex.code(base, "cpu") not in text and ex.how not in text
        assert not any(line.lstrip().startswith("answer =") for line in text.splitlines())
        assert max(len(line) for line in text.splitlines()) <= WIDTH


@pytest.mark.parametrize("name", list(EXERCISES))
def test_the_answer_cell_is_library_code_and_the_worked_solution_fills_it(base, name):
    """The cell the learner edits holds the libraries' objects (SFTConfig, LoraConfig, BitsAndBytesConfig, or an
    accelerate config), the same literal code on a CPU and a GPU; the worked solution is that cell filled in, and
    run, it passes the check (read back through from_library)."""
    from course_utils.recipe import base_recipe_for

    ex = exercise(name)
    cell = ex.answer_cell(base, "cpu")
    assert cell == ex.answer_cell(base_recipe_for("smollm2-360m", "cuda"), "gpu"), "the committed cell is machine's"
    assert "with_(" not in cell and ("SFTConfig(" in cell or "accelerate_config" in cell) and "# <- ?" in cell
    assert len(cell.splitlines()) <= 25 and max(map(len, cell.splitlines())) <= WIDTH
    code = ex.code(base, "cpu")
    assert "with_(" not in code and "# <- ?" not in code and code.splitlines()[1:] != cell.splitlines()[1:]
    verdict = ex.check(_run_cell(code, base), base, "cpu")
    assert verdict.passed, str(verdict)


def _library(code: str, **changes) -> str:
    """An answer cell with `name=value` arguments (or `name = value` lines) changed: what a learner types."""
    import re

    for name, value in changes.items():
        code, n = re.subn(rf"(?ms)^({name} = )\w+\(  #[^\n]*\n.*?^\)$", rf"\g<1>{value}", code, count=1)  # a call
        if not n:
            code, n = re.subn(rf"(?m)(\b{name}\s*[=:]\s*)[^,\n#]*?(?=\s*(?:,|#|$))", rf"\g<1>{value}", code, count=1)
        assert n == 1, f"{name} is not in the cell"
    return code


def _wrong_library(base: Recipe) -> list[tuple[str, dict, str]]:
    """(notebook, changes to its answer cell, words its verdict must say): wrong answers in library code."""
    return [
        ("00_where_memory_goes", {"peft_config": "None"}, "tokens is still the larger part"),
        ("01_gradient_checkpointing", {"per_device_train_batch_size": 64, "activation_checkpointing": False},
         "gradient_checkpointing is off"),
        ("02_gradient_accumulation", {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 1},
         "over the budget"),
        ("02_gradient_accumulation", {"per_device_train_batch_size": 4}, "train 16 sequences"),
        ("03_efficient_optimizers", {"optim": '"adamw_8bit"'}, "still LoRA"),
        ("04_mixed_precision", {"bf16": True}, "refuses precision='bf16'"),
        ("05_qlora_4bit", {"bnb_config": 'BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)',
                           "fp16": True, "activation_checkpointing": True}, "bnb_4bit_compute_dtype=bfloat16"),
        ("05_qlora_4bit", {"bnb_config": 'BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float16)',
                           "fp16": True}, "does not fit a T4"),
        ("06_sequence_length_and_batch", {"max_length": 384}, "over"),
        ("07_complete_recipe", {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2}, "refuses"),
        ("07_complete_recipe", {"bf16": False, "fp16": True, "per_device_train_batch_size": 16,
                                "gradient_accumulation_steps": 1}, "does not fit"),
        ("09_beyond_the_recipe", {"prepare_kbit": False}, "more than the chapter's 6GB"),
        ("09_beyond_the_recipe", {"max_length": 256, "prepare_kbit": False}, "also changes max_length: 512"),
        ("09_beyond_the_recipe", {"optim": '"paged_adamw_8bit", neftune_noise_alpha=5'}, "neftune_noise_alpha=5"),
        ("11_more_than_one_gpu", {"num_processes": 3}, "does not fit one card yet"),
        ("11_more_than_one_gpu", {"num_processes": "6#"}, "num_processes: '6#' is not a whole number"),
        ("11_more_than_one_gpu", {"num_processes": 6, "fsdp_offload_params": "true"}, "fsdp_offload_params"),
        ("11_more_than_one_gpu", {"num_processes": 6, "mixed_precision": "'no'\nnum_gpus: 6"}, "'num_gpus'"),
    ]


def test_a_wrong_library_answer_fails_with_its_message(base):
    """Wrong answers typed into the answer cell: the estimator's reason, or from_library's message naming the
    setting it does not model."""
    for name, changes, says in _wrong_library(base):
        answer = _run_cell(_library(exercise(name).answer_cell(base, "cpu"), **changes), base)
        verdict = check_exercise(name, answer, base, "cpu")
        assert not verdict.passed and str(verdict).startswith("Not yet: "), f"{name} {changes} passed:\n{verdict}"
        assert says in " ".join(str(verdict).split()), f"{name} {changes}: expected {says!r} in:\n{verdict}"


def _wrong(base: Recipe) -> list[tuple[str, Recipe, str]]:
    """(notebook, a wrong answer, words its verdict must say) on the tiny model's base recipe."""
    chapter, l8 = source_chapter_recipe(LLAMA), base.with_(model=LLAMA)
    return [
        ("00_where_memory_goes", base, "still LoRA"),
        ("00_where_memory_goes", base.with_(lora_r=None), "tokens is still the larger part"),
        ("00_where_memory_goes", base.with_(lora_r=None, micro_batch=1, max_seq_length=128, optimizer="adamw_8bit"),
         "change only"),
        ("01_gradient_checkpointing", base.with_(gradient_checkpointing=True), "not more than half"),
        ("01_gradient_checkpointing", base.with_(micro_batch=64), "gradient_checkpointing is off"),
        ("01_gradient_checkpointing", base.with_(gradient_checkpointing=True, max_seq_length=4096), "positions"),
        ("02_gradient_accumulation", base.with_(micro_batch=16, grad_accum=1), "over the budget"),
        ("02_gradient_accumulation", base.with_(micro_batch=1, grad_accum=16), "fits too"),
        ("02_gradient_accumulation", base, "train 16 sequences"),
        ("03_efficient_optimizers", base.with_(lora_r=None), "another keeps less"),
        ("03_efficient_optimizers", base.with_(optimizer="adamw_8bit"), "still LoRA"),
        ("03_efficient_optimizers", base.with_(lora_r=None, optimizer="adafactor"), "not one of the chapter's"),
        ("04_mixed_precision", base.with_(precision="bf16"), "refuses precision='bf16'"),
        ("04_mixed_precision", base, "no lower than fp32"),
        ("05_qlora_4bit", l8.with_(load_in_4bit=True), "does not fit a T4"),
        ("05_qlora_4bit", l8.with_(precision="auto", gradient_checkpointing=True), "not 4-bit"),
        ("05_qlora_4bit", base.with_(load_in_4bit=True, gradient_checkpointing=True), "Llama-3.1-8B"),
        ("05_qlora_4bit", l8.with_(load_in_4bit=True, gradient_checkpointing=True, max_seq_length=128),
         "keep the sequence length"),
        ("06_sequence_length_and_batch", base.with_(gradient_checkpointing=True, max_seq_length=384), "over"),
        ("06_sequence_length_and_batch", base.with_(gradient_checkpointing=True), "fits too"),
        ("06_sequence_length_and_batch", base.with_(gradient_checkpointing=True, max_seq_length=300), "multiple"),
        ("07_complete_recipe", chapter, "refuses"),
        ("07_complete_recipe", chapter.with_(precision="auto"), "fits a T4 too"),
        ("07_complete_recipe", chapter.with_(precision="auto", micro_batch=16, grad_accum=1), "does not fit"),
        ("07_complete_recipe", chapter.with_(precision="auto", micro_batch=8, grad_accum=1), "keep 16 sequences"),
        ("09_beyond_the_recipe", chapter, "more than the chapter's 6GB"),
        ("09_beyond_the_recipe", chapter.with_(prepare_kbit=False), "more than the chapter's 6GB"),
        ("09_beyond_the_recipe", chapter.with_(prepare_kbit=False, offload_embeddings=True, max_seq_length=256),
         "also changes max_length: 512"),
        ("09_beyond_the_recipe", chapter.with_(prepare_kbit=False, offload_embeddings=True, micro_batch=2),
         "keep 16 sequences"),
        ("09_beyond_the_recipe", chapter.with_(load_in_4bit=False), "change only"),
    ]


def test_a_wrong_answer_fails_with_a_reason(base):
    for name, answer, says in _wrong(base):
        verdict = check_exercise(name, answer, base, "cpu")
        assert not verdict.passed, f"{name}: {answer.describe()} passed:\n{verdict}"
        assert says in str(verdict), f"{name}: {answer.describe()}: expected {says!r} in:\n{verdict}"
        assert str(verdict).startswith("Not yet: ")


def test_a_failing_estimate_shows_its_figures(base):
    """A verdict the estimator decided (not a refused change) names the estimated figures."""
    for name, answer in (("01_gradient_checkpointing", base.with_(gradient_checkpointing=True)),
                         ("02_gradient_accumulation", base.with_(micro_batch=16, grad_accum=1)),
                         ("07_complete_recipe", source_chapter_recipe(LLAMA).with_(precision="auto"))):
        verdict = check_exercise(name, answer, base, "cpu")
        assert not verdict and any(" MiB" in line or " GiB" in line for line in verdict.lines), str(verdict)


def test_the_checks_use_the_estimate(base):
    """Exercise 02's budget and verdict are the estimator's figures for this base, not typed ones."""
    from course_utils.estimate import estimate

    lo = estimate(base.with_(micro_batch=1, grad_accum=16), hardware="cpu").peak_bytes
    hi = estimate(base.with_(micro_batch=16, grad_accum=1), hardware="cpu").peak_bytes
    task = exercise("02_gradient_accumulation").task(base, "cpu")
    assert f"({lo / MiB:,.1f} MiB)" in task and f"({hi / MiB:,.1f} MiB)" in task
    solved = exercise("02_gradient_accumulation").solution(base, "cpu")
    mine = estimate(solved, hardware="cpu").peak_bytes
    assert mine <= (lo + hi) / 2 + 0.1 * MiB
    assert estimate(solved.with_(micro_batch=2 * solved.micro_batch, grad_accum=solved.grad_accum // 2),
                    hardware="cpu").peak_bytes > (lo + hi) / 2
    assert f"{mine / MiB:,.1f} MiB" in str(check_exercise("02_gradient_accumulation", solved, base, "cpu"))


@pytest.mark.parametrize("name", list(EXERCISES))
def test_task_texts_hold_no_typed_figures(base, name):
    ex = exercise(name)
    for what, text in (("template", ex.template), ("title", ex.title), ("how", ex.how)):
        assert facts.unsourced(text) == [], f"{name} {what}: {[str(u) for u in facts.unsourced(text)]}"
    rendered = ex.task(base, "cpu")
    assert "{" not in rendered and "}" not in rendered
    wrong = [str(u) for u in facts.unsourced(rendered) if "does not hold" in u.context]
    assert not wrong, f"{name}: the task's shown arithmetic does not hold: {wrong}"


def test_the_chapters_claim_is_its_own_words():
    assert X.CLAIM in " ".join(facts.source_chapter().split())
    assert X.claim_bytes() == ("6GB", 6 * 10**9)


def test_bad_input_is_a_clear_error(base):
    with pytest.raises(ExerciseError, match="No exercise for '09_nothing'.*01_gradient_checkpointing"):
        check_exercise("09_nothing", None, base)
    with pytest.raises(ExerciseError, match="answer must be the libraries' objects.*SFTConfig.*base.with_"):
        check_exercise("01_gradient_checkpointing", {"gradient_checkpointing": True}, base)
    with pytest.raises(ExerciseError, match="base must be a Recipe"):
        show_exercise("01_gradient_checkpointing", "tiny")


def test_a_worked_solution_that_fails_its_check_is_an_error(base, monkeypatch):
    broken = dataclasses.replace(exercise("01_gradient_checkpointing"), solver=lambda start, hw: start)
    monkeypatch.setitem(EXERCISES, "01_gradient_checkpointing", broken)
    with pytest.raises(ExerciseError, match="fails its own check"):
        check_exercise("01_gradient_checkpointing", None, base, "cpu")


def test_the_hardware_is_this_machines_unless_the_exercise_fixes_it(monkeypatch):
    assert X.hardware_here() == "cpu"  # the test machine has no GPU
    monkeypatch.setattr(X, "hardware_here", lambda: "gpu")
    assert exercise("01_gradient_checkpointing").hw() == "gpu"
    assert exercise("05_qlora_4bit").hw() == "t4" and exercise("05_qlora_4bit").hw("gpu") == "t4"
    assert exercise("09_beyond_the_recipe").hw("t4") == "gpu"


@pytest.mark.parametrize("model", ["smollm2-360m", LLAMA])
@pytest.mark.parametrize("hardware", ["gpu", "t4"])
def test_the_solutions_hold_for_a_gpus_base_recipe(model, hardware):
    """On a GPU the base recipe is a preset's (4 x 512 tokens) and the checks estimate for that GPU."""
    from course_utils.recipe import base_recipe_for

    gpu_base = base_recipe_for(model, "cuda")
    for name in EXERCISES:
        ex = exercise(name)
        assert ex.check(ex.solution(gpu_base, hardware), gpu_base, hardware), name
        check_exercise(name, None, gpu_base, hardware)  # raises ExerciseError if the solution fails its check


def test_shown_text_fits_and_the_solution_shows_only_when_asked(base):
    from course_utils.chapter.solution_reveal import BUTTON, SolutionReveal
    from course_utils.chapter.quiz.static_copy import WIDGET_VIEW

    for name in EXERCISES:
        code = exercise(name).code(base, "cpu")
        task, button = show_exercise(name, base, "cpu"), show_solution(name, base, "cpu")
        assert task._repr_markdown_().startswith("**Try it: ") and task._repr_html_() is None
        # not asked: a button, and nothing of the solution in its static copy or its widgets' state
        assert isinstance(button, SolutionReveal) and not button.revealed
        bundle = button._repr_mimebundle_()
        assert bundle[WIDGET_VIEW]["model_id"] == button.model_id
        shown = bundle["text/plain"] + bundle["text/markdown"] + button.solution.value
        assert code not in shown and "answer =" not in shown and BUTTON in shown
        assert f'show_solution("{name}", {exercise(name).base_name}, reveal=True)' in bundle["text/plain"].replace(
            "\n  ", " ")
        for shown in (task, button):
            assert max(len(line) for line in repr(shown).splitlines()) <= WIDTH, name
        # asked: the button shows it (open) and goes; reveal=True returns it
        button.button.click()
        assert button.revealed and button.button.layout.display == "none"
        assert button.solution.value.startswith("<details open><summary>Worked solution")
        assert html.escape(code) in button.solution.value
        solution = show_solution(name, base, "cpu", reveal=True)
        assert solution._repr_html_().startswith("<details><summary>Worked solution")
        assert code in repr(solution)
        assert max(len(line) for line in repr(solution).splitlines()) <= WIDTH, name


# --- the insert script -------------------------------------------------------------------------------------
def _copy(tmp_path: Path) -> list[Path]:
    from course_utils.chapter.exercises import WITHOUT_EXERCISE

    for p in (p for p in NOTEBOOKS if p.stem not in WITHOUT_EXERCISE):
        shutil.copy(p, tmp_path / p.name)
    return sorted(tmp_path.glob("*.ipynb"))


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _tagged(cell: dict, tag: str = "exercise") -> bool:
    return tag in cell.get("metadata", {}).get("tags", [])


def test_the_script_inserts_one_block_before_the_quiz_and_is_idempotent(tmp_path, script):
    paths = _copy(tmp_path)
    for p in paths:  # the notebooks as they were before the exercises (the committed ones have them, run)
        nb = json.loads(p.read_text())
        nb["cells"] = [c for c in nb["cells"] if not _tagged(c)]
        p.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    before = {p.name: [c for c in _cells(p) if not _tagged(c)] for p in paths}
    assert script.main(["exercises", *map(str, paths)]) == 0
    once = {p.name: p.read_bytes() for p in paths}
    assert script.main(["exercises", *map(str, paths)]) == 0
    assert {p.name: p.read_bytes() for p in paths} == once
    assert script.main(["exercises", "--check", *map(str, paths)]) == 0
    for p in paths:
        cells = _cells(p)
        assert [c for c in cells if not _tagged(c)] == before[p.name], f"{p.name}: another cell changed"
        block = [i for i, c in enumerate(cells) if _tagged(c)]
        assert len(block) == 5 and block == list(range(block[0], block[0] + 5)), p.name
        assert script.QUIZ_MARK in "".join(cells[block[-1] + 1]["source"]), f"{p.name}: not right before the quiz"
        assert "".join(cells[block[0]]["source"]).startswith("## Try it")
        assert facts.unsourced("".join(cells[block[0]]["source"])) == []  # what the truth test reads
        solution = [c for c in cells if _tagged(c, "solution")]
        assert len(solution) == 1 and solution[0]["metadata"]["jupyter"] == {"source_hidden": True}
        assert len({c["id"] for c in cells}) == len(cells)
        for c in (cells[i] for i in block if cells[i]["cell_type"] == "code"):
            source = "".join(c["source"])
            assert c["outputs"] == [] and c["execution_count"] is None
            assert len(source.splitlines()) <= 25, f"{p.name}: a long exercise cell"
            assert not any(isinstance(n, (ast.FunctionDef, ast.Lambda)) for n in ast.walk(ast.parse(source)))


def test_the_script_keeps_outputs_and_replaces_a_stale_block(tmp_path, script):
    path = _copy(tmp_path)[1]
    script.main(["exercises", str(path)])
    nb = json.loads(path.read_text(encoding="utf-8"))
    check = next(c for c in nb["cells"] if _tagged(c) and "check_exercise" in "".join(c["source"]))
    check["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["Holds: ...\n"]}]
    answer = next(c for c in nb["cells"] if _tagged(c) and "answer =" in "".join(c["source"]))
    answer["source"] = ["answer = None  # your recipe: base.with_(...) (an old, stale cell)\n"]
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    assert script.main(["exercises", "--check", str(path)]) == 1
    script.main(["exercises", str(path)])
    cells = _cells(path)
    assert sum(_tagged(c) for c in cells) == 5
    assert next(c for c in cells if _tagged(c) and "check_exercise" in "".join(c["source"]))["outputs"]
    assert any("SFTConfig(" in "".join(c["source"]) for c in cells if _tagged(c))


def test_the_inserted_cells_run_and_pass(tmp_path, script, base):
    """The exercise cells as a notebook runs them (base, chapter and path as the notebooks define them)."""
    from course_utils.chapter import beyond_the_recipe as beyond
    from course_utils.chapter.solution_reveal import SolutionReveal

    paths = _copy(tmp_path)
    script.main(["exercises", *map(str, paths)])
    for p in paths:
        scope = {"base": base, "chapter": source_chapter_recipe(LLAMA), "path": beyond.path_here("tiny")}
        shown = []
        for c in (c for c in _cells(p) if _tagged(c) and c["cell_type"] == "code"):
            tree = ast.parse("".join(c["source"]))
            last = tree.body.pop() if isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, p.name, "exec"), scope)
            if last is not None:
                shown.append(eval(compile(ast.Expression(last.value), p.name, "eval"), scope))
        task, solution, verdict = shown
        assert isinstance(task, X.Shown) and isinstance(solution, SolutionReveal) and scope["answer"] is not None
        assert not verdict.passed and "the worked solution passes this check here" in str(verdict), p.name
        assert str(verdict).startswith("Not yet: nothing changed yet"), p.name


def test_the_exercise_modules_stay_small():
    for module in (X,):
        assert len(Path(module.__file__).read_text().splitlines()) < 500, module.__name__


def test_the_committed_answer_cells_are_the_rungs_in_library_code(base):
    """Each notebook's answer cell, as committed, is its exercise's answer_cell (the libraries' objects, not a
    Recipe); run as nbval runs it, it leaves the starting rung in `answer`, which the check reads as unchanged."""
    from course_utils.chapter.exercises import WITHOUT_EXERCISE

    for p in (p for p in NOTEBOOKS if p.stem not in WITHOUT_EXERCISE):
        ex = exercise(p.stem)
        cells = [c for c in _cells(p) if _tagged(c) and c["cell_type"] == "code"]
        source = "".join(cells[1]["source"])
        assert source == ex.answer_cell(base, "cpu"), p.name
        assert "with_(" not in source and cells[1]["outputs"] == []
        assert ex.unchanged(_run_cell(source, base), base, "cpu"), p.name
