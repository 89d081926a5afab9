"""The estimator against measurement: the tiny model on this CPU (deterministic), the GPU reference runs,
the arithmetic it explains, the expected-memory table and `course estimate`.

Cost: one in-process measurement (run_here, 2-5 s each) per recipe of tiny_check_recipes(), 12 in
all, shared by every test in this module (and test_measure's: conftest's tiny_check_run).
"""

from __future__ import annotations

import pytest

from course_utils.estimate import CATEGORIES, tiny_check_recipes
from course_utils.models import PRESETS

TOLERANCE = 0.10  # the issue's bar: within 10% of the measurement
BIG = 0.05  # a category is "big" when it holds at least 5% of the measured peak
TINY_RECIPES = {r.label: r for r in tiny_check_recipes()}


@pytest.fixture(scope="module")
def tiny_measured(tiny_check_run):
    """Every tiny check recipe measured once, in this process (conftest's tiny_check_run)."""
    return {label: tiny_check_run(label) for label in TINY_RECIPES}


def big_categories(m) -> list[str]:
    """The categories that hold at least BIG of the measured peak."""
    return [c for c in CATEGORIES if m.peak_by_category.get(c, 0) >= BIG * m.peak_bytes]


def test_the_check_covers_what_the_issue_asks():
    recipes = list(TINY_RECIPES.values())
    assert len(recipes) <= 12  # each one is a run_here in the fixture
    assert any(not r.uses_lora for r in recipes)
    assert {1, 8} <= {r.micro_batch for r in recipes}
    assert {128, 512} <= {r.max_seq_length for r in recipes}
    assert {True, False} == {r.double_quant for r in recipes if r.load_in_4bit}
    assert {True, False} == {r.gradient_checkpointing for r in recipes}
    assert all(r.precision == "fp32" for r in recipes)


@pytest.mark.parametrize("label", list(TINY_RECIPES))
def test_tiny_peak_and_big_categories_within_10_percent(tiny_measured, label):
    from course_utils.estimate import estimate

    m = tiny_measured[label]
    assert m.fits, m.error
    e = estimate(TINY_RECIPES[label], hardware="cpu")
    assert e.peak_bytes == pytest.approx(m.peak_bytes, rel=TOLERANCE)
    for cat in big_categories(m):
        assert e.by_category[cat] == pytest.approx(m.peak_by_category[cat], rel=TOLERANCE), cat


def test_tiny_measurement_is_deterministic_and_matched_closely(tiny_measured):
    """The CPU measurement repeats to the byte, and the estimate reproduces it to well under 1%."""
    from course_utils.estimate import estimate
    from course_utils.child import run_here

    label = "+ accumulation (micro-batch 1)"
    again = run_here(TINY_RECIPES[label])
    assert again.peak_bytes == tiny_measured[label].peak_bytes
    for lbl, m in tiny_measured.items():
        assert estimate(TINY_RECIPES[lbl], hardware="cpu").peak_bytes == pytest.approx(m.peak_bytes, rel=0.01), lbl


def test_reference_runs_within_10_percent():
    from course_utils.estimate import estimate
    from course_utils.results import reference_results

    refs = reference_results()
    assert len(refs) >= 18
    for m in refs:
        e = estimate(m.recipe_obj, hardware="gpu")
        assert e.peak_bytes == pytest.approx(m.peak_bytes, rel=TOLERANCE), m.label
        for cat in big_categories(m):
            assert e.by_category[cat] == pytest.approx(m.peak_by_category[cat], rel=TOLERANCE), (m.label, cat)


def test_peak_moments_match_the_references():
    """Full FT peaks in the optimizer step; QLoRA 16x1 in backward before any gradient exists."""
    from course_utils.estimate import estimate
    from course_utils.results import reference_results

    refs = {(m.recipe["model"], m.label): m for m in reference_results()}
    full = refs[("llama-3.1-8b", "full FT bf16, no ckpt, 1x16, adamw_torch")]
    e = estimate(full.recipe_obj)
    assert "optimizer step" in e.moment
    assert e.by_category["temporaries"] == pytest.approx(e.by_category["parameters"], rel=0.01)
    qlora = refs[("llama-3.1-8b", "QLoRA 16x1")]
    e = estimate(qlora.recipe_obj)
    assert "backward" in e.moment and e.by_category["gradients"] == 0 == qlora.peak_by_category["gradients"]


def test_every_shipped_gpu_run_within_two_percent():
    """The estimator against all shipped H200 runs (the chapter's and notebook 09's), activation offloading aside:
    it is the one change the estimator does not model."""
    from course_utils.estimate import estimate
    from course_utils.results import all_reference_results

    refs = [m for m in all_reference_results() if m.fits and not m.recipe.get("offload_activations")]
    assert len(refs) >= 30
    for m in refs:
        e = estimate(m.recipe_obj, hardware="gpu")
        assert e.peak_bytes == pytest.approx(m.peak_bytes, rel=0.02), m.label


def test_padded_batches_add_a_mask_per_layer():
    """Packing drops short blocks, so measured batches are never padded; padded=True models batches that are."""
    from course_utils.estimate import estimate
    from course_utils.recipe import source_chapter_recipe

    r = source_chapter_recipe("llama-3.1-8b").with_(micro_batch=4, grad_accum=4)
    assert estimate(r, padded=True).peak_bytes > estimate(r).peak_bytes


@pytest.mark.parametrize("recipe_kind", ["qlora", "full", "lora-no-ckpt", "t4"])
def test_explain_mentions_every_term(recipe_kind):
    from course_utils.estimate import estimate, fmt_bytes
    from course_utils.recipe import Recipe, source_chapter_recipe

    recipe, hardware = {
        "qlora": (source_chapter_recipe("llama-3.1-8b"), "gpu"),
        "full": (Recipe(model="llama-2-7b", lora_r=None, precision="bf16", micro_batch=2, grad_accum=8,
                        optimizer="adamw_8bit"), "gpu"),
        "lora-no-ckpt": (Recipe(model="mistral-7b", precision="bf16", micro_batch=4), "gpu"),
        "t4": (source_chapter_recipe("llama-3.1-8b").with_(precision="auto"), "t4"),
    }[recipe_kind]
    e = estimate(recipe, hardware=hardware)
    flat = lambda text: " ".join(text.split())  # noqa: E731  (explain() wraps its lines at 100 characters)
    text = flat(e.explain())
    assert e.terms
    for t in e.terms:
        assert flat(t.name) in text and flat(t.arithmetic) in text and flat(fmt_bytes(t.nbytes)) in text, t
    for cat in CATEGORIES:
        assert cat in text
    assert flat(fmt_bytes(e.peak_bytes)) in text and flat(e.moment) in text
    assert sum(e.by_category.values()) == e.peak_bytes


def test_nf4_bits_per_param_on_a_big_linear():
    from course_utils.estimate import nf4_bits_per_param, nf4_bytes

    assert nf4_bits_per_param(double_quant=True) == pytest.approx(4.127, abs=0.002)
    assert nf4_bits_per_param(double_quant=False) == pytest.approx(4.5, abs=0.001)
    n = 4096 * 14336  # one Llama-3.1-8B MLP matrix
    assert nf4_bytes(n, True) < nf4_bytes(n, False) < n // 2 * 1.13


def test_qlora_parameters_keep_embeddings_unquantized_in_fp32():
    from course_utils.estimate import estimate
    from course_utils.recipe import source_chapter_recipe

    e = estimate(source_chapter_recipe("llama-3.1-8b"))
    names = {t.name: t for t in e.terms if t.category == "parameters"}
    q = next(t for n, t in names.items() if n.startswith("q_proj"))
    assert "4.127 bits/param" in q.name and "32 layers x 4096 x 4096 x 0.5159 B" in q.arithmetic
    embed = next(t for n, t in names.items() if n.startswith("embed_tokens"))
    assert embed.nbytes == 128256 * 4096 * 4 and "prepare_model_for_kbit_training" in embed.name


@pytest.mark.parametrize("model", list(PRESETS))
def test_every_preset_estimates_offline(model):
    from course_utils.estimate import estimate
    from course_utils.recipe import Recipe, source_chapter_recipe

    for recipe in (source_chapter_recipe(model), Recipe(model=model, lora_r=None, precision="bf16")):
        e = estimate(recipe)
        assert e.peak_bytes > 0 and set(e.by_category) == set(CATEGORIES)
    t4 = estimate(source_chapter_recipe(model).with_(precision="auto"), hardware="t4")
    assert t4.precision == "fp16"


def test_unknown_model_is_a_clear_error():
    from course_utils.estimate import estimate
    from course_utils.models import ModelUnavailableError
    from course_utils.recipe import Recipe

    with pytest.raises(ModelUnavailableError, match="no-such-org/no-such-model"):
        estimate(Recipe(model="no-such-org/no-such-model"))


def test_expected_memory_table_rows_and_labels():
    from course_utils.estimate import expected_memory_table, format_expected_table

    rows = expected_memory_table()
    expected = [("7B", "llama-2-7b"), ("8B", "llama-3.1-8b"), ("13B", "llama-2-13b"), ("70B", "llama-3.1-70b")]
    assert [(r.size, r.model) for r in rows] == expected
    sources = {(r.size, which): getattr(r, which).source for r in rows for which in ("without", "full")}
    assert sources == {("7B", "without"): "estimated", ("7B", "full"): "estimated",
                       ("8B", "without"): "measured", ("8B", "full"): "measured",
                       ("13B", "without"): "estimated", ("13B", "full"): "measured",
                       ("70B", "without"): "estimated", ("70B", "full"): "estimated"}
    by_size = {r.size: r for r in rows}
    assert (by_size["7B"].without.claim, by_size["70B"].full.claim) == ("~14GB", "~40-48GB")
    assert by_size["8B"].without.claim == "" and by_size["8B"].full.claim == ""
    # read honestly, "without optimization" is far above the chapter's weights-only figure
    assert by_size["7B"].without.peak_bytes > 4 * 14e9
    for r in rows:
        for cell in (r.without, r.full):
            if cell.measured is not None:
                assert cell.peak_bytes == cell.measured.peak_bytes
                assert cell.estimate.peak_bytes == pytest.approx(cell.measured.peak_bytes, rel=TOLERANCE)
    text = format_expected_table(rows)
    assert "measured" in text and "estimated" in text and "~8-10GB" in text
    # both readings of "without optimization": pure bf16 AdamW (measured) and standard mixed precision
    assert "4 + 4 + 2 x 4 = 16 bytes per" in text and "Its loss per step" in text
    assert max(len(line) for line in text.splitlines()) <= 118  # a notebook's output fits without wrapping


def test_readme_shows_the_expected_table_as_printed():
    from pathlib import Path

    from course_utils.estimate import expected_memory_table, format_expected_table

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme.split("<!-- expected-table -->\n```\n", 1)[1].split("\n```\n<!-- /expected-table -->", 1)[0]
    assert block == format_expected_table(expected_memory_table())


def test_course_estimate_prints_the_table(capsys):
    from course_utils.cli import main

    assert main(["estimate"]) == 0
    out = capsys.readouterr().out
    assert "Without optimization" in out and "llama-3.1-70b" in out


@pytest.mark.parametrize("model", list(PRESETS))
def test_course_estimate_every_preset(model, capsys):
    from course_utils.cli import main

    assert main(["estimate", "--model", model]) == 0
    assert main(["estimate", "--model", model, "--source", "--micro-batch", "4", "--grad-accum", "4"]) == 0
    assert main(["estimate", "--model", model, "--lora-r", "none", "--no-gradient-checkpointing",
                 "--hardware", "t4"]) == 0
    out = capsys.readouterr().out
    assert f"Estimate for {model}" in out and "The peak is" in out


def test_course_estimate_tiny_and_errors(tiny_model, capsys):
    from course_utils.cli import main

    assert main(["estimate", "--model", "tiny", "--hardware", "cpu"]) == 0
    assert "Estimate for tiny" in capsys.readouterr().out
    assert main(["estimate", "--model", "llama-3.1-8b", "--precision", "bf16", "--hardware", "t4"]) == 2
    assert "bf16" in capsys.readouterr().err


# --- the package's layout ------------------------------------------------------------------------
LAYERS = ("terms", "shapes", "activations", "peak", "reports", "distributed", "limits", "plan",
          "planner")  # each imports only those before it (and the package, whose __init__ names the first six)


def test_estimate_modules_are_small_and_import_down_the_layers():
    import ast
    from pathlib import Path

    import course_utils.estimate as E

    package = Path(E.__file__).parent
    assert {p.stem for p in package.glob("*.py")} == {"__init__", *LAYERS}
    for i, name in enumerate(LAYERS):
        text = (package / f"{name}.py").read_text()
        assert len(text.splitlines()) < 480, name
        imported = {n.module.rsplit(".", 1)[-1] for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ImportFrom)
                    and (n.module or "").startswith("course_utils.estimate.")}
        assert imported <= set(LAYERS[:i]), (name, imported)
        if i < 6:  # the package's __init__ imports these six: they cannot import the package back
            assert "course_utils.estimate" not in {n.module for n in ast.walk(ast.parse(text))
                                                  if isinstance(n, ast.ImportFrom)}, name


def _estimate_imports(tree) -> set[str]:
    """Names a module's source imports from course_utils.estimate (absolute, or relative inside course_utils)."""
    import ast

    return {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
            and (n.module == "course_utils.estimate" or (n.level == 1 and n.module == "estimate"))
            for a in n.names}


def test_every_name_imported_from_the_estimator_is_there():
    """Notebooks, scripts, tests and course_utils import from course_utils.estimate: the package keeps each name."""
    import ast
    import importlib.util
    import json
    from pathlib import Path

    import course_utils.estimate as E

    root = Path(__file__).resolve().parents[1]
    wanted = set()
    for path in [*root.rglob("course_utils/**/*.py"), *root.glob("scripts/**/*.py"), *root.glob("tests/*.py")]:
        wanted |= _estimate_imports(ast.parse(path.read_text()))
    for path in root.glob("notebooks/*.ipynb"):
        for cell in json.loads(path.read_text())["cells"]:
            code = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
            lines = [line for line in code.splitlines() if not line.lstrip().startswith(("%", "!"))]
            wanted |= _estimate_imports(ast.parse("\n".join(lines)))
    assert {"estimate", "expected_memory_table", "model_shapes", "get_hardware"} <= wanted  # the scan works
    # a submodule (`from course_utils.estimate import plan`) is an attribute only once imported: found by its spec
    missing = [n for n in wanted - set(dir(E)) if importlib.util.find_spec(f"course_utils.estimate.{n}") is None]
    assert not sorted(missing)



@pytest.mark.parametrize("kw", [dict(precision="fp32"), dict(precision="fp32", gradient_checkpointing=True),
                                dict(precision="bf16", load_in_4bit=True, prepare_kbit=True)],
                         ids=["fp32", "fp32 ckpt", "4-bit bf16, fp32 upcast"])
def test_without_dropout_lora_keeps_each_shared_input_once_to_the_byte(kw, bf16_anywhere):
    """lora_dropout=0: q/k/v (and gate/up) read one tensor, kept once unless a cast copies it for each (the upcast's
    fp32 norm output under bf16 autocast); o_proj's input is the attention's output."""
    from course_utils.estimate import estimate
    from course_utils.child import run_here
    from course_utils.recipe import Recipe

    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    r = Recipe(model="tiny", micro_batch=2, max_seq_length=64, steps=3, warmup_steps=1, lora_dropout=0.0,
               lora_targets=targets, label="no dropout, every linear", **kw)
    m, e = run_here(r), estimate(r, hardware="cpu")
    assert m.peak_by_category["activations"] == e.by_category["activations"]
    if kw["precision"] == "fp32":  # (bf16 on a CPU: the estimate's temporaries are not exact, with dropout either)
        assert m.peak_bytes == e.peak_bytes
    if not r.gradient_checkpointing:  # (with it, only each layer's input is an activation)
        assert estimate(r.with_(lora_dropout=0.05), hardware="cpu").by_category["activations"] > m.peak_by_category[
            "activations"]


def test_the_h200_tries_measured_what_dropout_0_saves():
    """The H200's 16x1 step with and without LoRA dropout (shipped tries, one lease): the estimate's difference is
    the tracker's, to its 0.1 MiB rounding."""
    from course_utils.chapter import toward_the_limit as tries
    from course_utils.common import MiB
    from course_utils.estimate import estimate
    from course_utils.recipe import Recipe

    lines = {d["variant"]: d for d in tries.records() if d["run"] == "tries-20261202-0434"}
    a, b = lines["16x1 offload"], lines["16x1 offload, dropout 0"]
    ea, eb = (estimate(Recipe(**d["recipe"]), hardware="gpu").peak_bytes / MiB for d in (a, b))
    assert ea - eb == pytest.approx(a["tracked_peak_mib"] - b["tracked_peak_mib"], abs=0.1)


def test_without_dropout_o_proj_shares_the_attention_output_only_where_a_fused_kernel_keeps_it():
    """The math kernel copies its output before o_proj (transpose + contiguous), so LoRA keeps o_proj's own input."""
    import dataclasses

    from course_utils.estimate import model_shapes
    from course_utils.estimate.activations import lora_piece
    from course_utils.estimate.terms import Setup, dtypes_for
    from course_utils.machine import get_hardware
    from course_utils.recipe import Recipe

    hw = get_hardware("gpu")
    r = Recipe(model="llama-3.1-8b", precision="bf16", load_in_4bit=True, prepare_kbit=False, lora_dropout=0.0)
    x = Setup(r, model_shapes(r.model), dtypes_for(r, "bf16", hw), hw, "bf16", "flash", False)
    math = dataclasses.replace(x, kernel="math")
    assert lora_piece(math).per_token - lora_piece(x).per_token == x.shapes.q_dim * x.dtypes.compute
    dropped = dataclasses.replace(x, recipe=r.with_(lora_dropout=0.05))
    assert lora_piece(dataclasses.replace(dropped, kernel="math")).per_token == lora_piece(dropped).per_token
