"""Toward the limit (issue 16, course_utils.limits): the FLOPs per token, the compute limit at a GPU's datasheet
peak and the memory floor, each against a hand computation from Llama-3.1-8B's published shape; the runs against
both (course_utils.beyond) and the README's figures, rendered from them."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from course_utils.chapter import beyond_the_recipe as beyond
from course_utils.chapter import toward_the_limit
from course_utils.chapter import facts, figures
from course_utils.estimate import limits
from course_utils.recipe import Recipe, source_chapter_recipe

ROOT = Path(__file__).resolve().parents[1]

# Llama-3.1-8B's config (meta-llama/Llama-3.1-8B config.json), typed here so the test does not read it the way the
# code does: 32 layers, hidden 4096, intermediate 14336, 32 query heads and 8 key/value heads of 128, vocab 128256
LAYERS, HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 32, 4096, 14336, 32, 8, 128, 128256
Q, KV = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
LINEARS = {"q_proj": (HIDDEN, Q), "k_proj": (HIDDEN, KV), "v_proj": (HIDDEN, KV), "o_proj": (Q, HIDDEN),
           "gate_proj": (HIDDEN, INTER), "up_proj": (HIDDEN, INTER), "down_proj": (INTER, HIDDEN)}
LAYER_WEIGHTS = LAYERS * sum(i * o for i, o in LINEARS.values())  # 6,979,321,856
HEAD = VOCAB * HIDDEN  # lm_head (untied), 525,336,576


def by_hand(seq: int, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"), r: int = 16, ckpt: bool = True,
            full: bool = False) -> int:
    """FLOPs per token, 2 per multiply-add: forward over every weight a token meets and attention (causal: seq/2
    keys on average, scores and values); backward: the same matmuls for the input gradients (attention twice), plus
    the weight gradients of what trains; checkpointing: the layers' forward (not the head's) once more."""
    lora = 0 if full else LAYERS * sum(r * (LINEARS[t][0] + LINEARS[t][1]) for t in lora_targets)
    trained = LAYER_WEIGHTS + HEAD if full else lora
    attn = LAYERS * 2 * (2 * Q * seq // 2)
    fwd = 2 * (LAYER_WEIGHTS + HEAD + lora) + attn
    bwd = 2 * (LAYER_WEIGHTS + HEAD + lora) + 2 * attn + 2 * trained
    return fwd + bwd + ((2 * (LAYER_WEIGHTS + lora) + attn) if ckpt else 0)


def test_hand_shapes_are_the_models():
    from course_utils.estimate import model_shapes

    s = model_shapes("llama-3.1-8b")
    assert (s.linear_params, s.lm_head_params, s.embed_params, s.q_dim) == (LAYER_WEIGHTS, HEAD, HEAD, Q)
    assert LAYER_WEIGHTS == 6_979_321_856


def test_flops_per_token_of_the_source_recipe_is_the_hand_computation():
    f = limits.flops_per_token(source_chapter_recipe("llama-3.1-8b"))
    assert f.total == by_hand(512) == 44_623_200_256  # 15.17 forward + 15.33 backward + 14.12 recomputed GFLOP
    assert (f.forward, f.backward, f.recompute) == (15_170_797_568, 15_332_278_272, 14_120_124_416)
    assert f.per_token == f.total
    text = f.explain()
    assert "44.62 GFLOP per token" in text and "recomputation 32% of it" in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_the_arithmetic_shows_the_half_sequence_it_counts():
    """A causal token sees seq/2 earlier tokens on average: an odd sequence's 64.5, not 64 (the total counts 64.5)."""
    f = limits.flops_per_token(source_chapter_recipe("llama-3.1-8b").with_(max_seq_length=129))
    assert f.attention == LAYERS * 2 * 2 * Q * 64.5
    assert f"x {Q:,} x 64.5 (causal: half of 129)" in f.explain()
    assert "x 256 (causal: half of 512)" in limits.flops_per_token(source_chapter_recipe("llama-3.1-8b")).explain()


@pytest.mark.parametrize("change, hand", [
    (dict(gradient_checkpointing=False), dict(ckpt=False)),
    (dict(max_seq_length=128), dict(seq=128)),
    (dict(lora_r=None, load_in_4bit=False, gradient_checkpointing=False), dict(full=True, ckpt=False)),
    (dict(lora_targets=tuple(LINEARS), lora_r=8), dict(lora_targets=tuple(LINEARS), r=8)),
])
def test_flops_per_token_follows_each_knob(change, hand):
    recipe = source_chapter_recipe("llama-3.1-8b").with_(**change)
    assert limits.flops_per_token(recipe).total == by_hand(**{"seq": 512, **hand})


def test_the_t4_check_counts_the_same_flops():
    from course_utils.chapter import t4 as t4check

    # one count: the T4 time budget uses this module's function (it had a copy, then a one-line sum nobody read)
    assert t4check.flops_per_token is limits.flops_per_token and t4check.Flops is limits.Flops


def test_memory_floor_is_the_hand_computation():
    # NF4 with double quant: 4 bits + an 8-bit scale per 64 weights + an fp32 scale per 256 scales, and per tensor
    # a 16-value fp32 code book, a 256-value fp32 code book and an fp32 offset
    bits = 4 + 8 / 64 + 32 / (64 * 256)
    assert round(bits, 3) == 4.127
    tensors = LAYERS * len(LINEARS)
    nf4 = LAYER_WEIGHTS * bits / 8 + tensors * (16 * 4 + 256 * 4 + 4)
    norms = (2 * LAYERS + 1) * HIDDEN * 2  # two per layer and the final one, bf16
    floor = limits.memory_floor(source_chapter_recipe("llama-3.1-8b"))
    assert floor.total == nf4 + 2 * HEAD * 2 + norms == 5_702_540_160  # 5.31 GiB
    offloaded = limits.memory_floor(source_chapter_recipe("llama-3.1-8b").with_(offload_embeddings=True))
    assert floor.total - offloaded.total == HEAD * 2  # the input table, in CPU memory
    assert "4.127 bits" in floor.explain() and "memory floor" in floor.explain()
    # the source recipe upcasts the tables to fp32: the floor is still what the step cannot do without, in bf16
    assert limits.memory_floor(source_chapter_recipe("llama-3.1-8b").with_(prepare_kbit=False)) == floor


def test_datasheet_peak_and_limit():
    from course_utils.machine import H200_PEAK_FLOPS

    assert limits.datasheet_peak("NVIDIA H200") == H200_PEAK_FLOPS["bf16"] == 989e12  # dense; 1,979 is sparse
    assert limits.datasheet_peak("NVIDIA H200 NVL") is None  # another card: no peak rather than a wrong one
    recipe = source_chapter_recipe("llama-3.1-8b")
    assert limits.limit_tokens_per_s(recipe, 989e12) == pytest.approx(989e12 / 44_623_200_256)


def test_a_run_against_its_limit_and_floor():
    m = beyond.by_label(beyond.reference())["fast recipe (16x1)"]
    a = limits.against(m)
    assert a.fraction == pytest.approx(m.tokens_per_s * 44_623_200_256 / 989e12)
    assert a.floor_gib == pytest.approx(5_702_540_160 / 2**30) and a.over_floor == a.allocated_gib / a.floor_gib
    assert limits.against(m, peak_flops=790e12).fraction == pytest.approx(m.tokens_per_s * 44_623_200_256 / 790e12)
    faster = dataclasses.replace(m, tokens_per_s=2 * m.tokens_per_s)
    assert limits.against(faster).fraction == pytest.approx(2 * a.fraction)
    elsewhere = dataclasses.replace(m, env={**m.env, "device": "Some GPU"})
    assert limits.against(elsewhere).fraction is None


def test_toward_the_limit_shows_the_arithmetic_and_every_run():
    runs = beyond.reference(run="peer-run") + beyond.peer_reference()
    text = toward_the_limit.toward_the_limit(runs)
    assert "989 TFLOP/s" in text and "44.62 GFLOP" in text and "memory floor" in text and "4.127 bits" in text
    assert all(m.label.split(" (")[0][:20] in text for m in runs)
    assert max(len(line) for line in text.splitlines()) <= 100
    assert toward_the_limit.toward("Unsloth 2026.10.9 (16x1)", "peer-run").fraction > 0
    with pytest.raises(KeyError, match="no side-by-side run"):
        toward_the_limit.toward("nothing")


def test_toward_the_limit_names_the_shipped_matmul_rate_of_its_gpu(monkeypatch):
    runs = beyond.reference()
    rate = limits.measured_peak("NVIDIA H200")
    allowed = rate.flops_per_s / limits.flops_per_token(runs[0].recipe_obj).total
    text = " ".join(toward_the_limit.toward_the_limit(runs, table=False).split())
    assert f"measured {rate.tflops:,.1f} TFLOP/s on an NVIDIA H200" in text
    assert f"allows {allowed:,.0f} tokens/s" in text
    monkeypatch.setattr(limits, "measured_peak", lambda *a: (_ for _ in ()).throw(KeyError("none")))
    assert "peak_matmul.py measures one" in " ".join(toward_the_limit.toward_the_limit(runs, table=False).split())


def test_toward_a_run_that_did_not_fit_says_so(monkeypatch):
    runs = beyond.reference()
    gone = dataclasses.replace(beyond.by_label(runs)["fast recipe (16x1)"], status="does_not_fit")
    monkeypatch.setattr(toward_the_limit, "reference", lambda *a, **k: [gone])
    with pytest.raises(ValueError, match="'fast recipe \\(16x1\\)' has no allocated peak and speed"):
        toward_the_limit.toward("fast recipe (16x1)")


def test_readme_limit_figures_render_from_their_sources(monkeypatch):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    bullet = text[text.index("- **Toward the limit**"):]
    bullet = bullet[:bullet.index("\n- ")]
    pinned = facts.pinned(bullet)
    assert len(pinned) >= 20 and facts.unsourced(bullet) == []
    named = figures.registry()  # a text pins a figure by its name; the name's expression is the source
    sources = [" ".join(named[n].expr for n in re.findall(r"[a-z_0-9]+", expr) if n in named) for _, _, expr in pinned]
    assert any("toward(" in src and ".fraction" in src for src in sources)
    assert any("lib.h200_bf16_tflops" in src for src in sources)
    # every figure but the NF4 bits and the stretch goal's is a placeholder of limits' arithmetic
    numbers = re.sub(r"<!--\{\{.*?\}\}-->", "", bullet)
    assert "44.62 GFLOP" in numbers and "22,163 tokens/s" in numbers
    # the datasheet's peak drives the fractions: another peak leaves the README's figures stale
    from course_utils.machine import H200_PEAK_FLOPS

    monkeypatch.setitem(H200_PEAK_FLOPS, "bf16", 790e12)
    stale = [u for u in facts.unsourced(bullet) if "stale" in u.context]
    assert any("fraction" in u.context for u in stale) and any("limit_tokens_per_s" in u.context for u in stale)


def test_the_readme_says_whether_a_shipped_run_reaches_the_stretch_goal():
    """The README states in words whether any shipped 16 x 1 run reaches issue 16's stretch goal (a fraction of the
    compute limit within a memory cap): this fails when a new run changes the answer, so the words are updated."""
    from course_utils.chapter import beyond_the_recipe as beyond

    runs = toward_the_limit.limit_rows(beyond.reference() + beyond.reference(run="peer-run"))
    reached = any(r.fraction >= toward_the_limit.STRETCH_LIMIT_FRACTION and r.allocated_gib <= toward_the_limit.STRETCH_MAX_GIB
                  for r in runs if "16x1" in r.label)
    text = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    claim = re.search(r"The issue's stretch goal, .{0,200}? GiB, (is not reached|is reached)", text)
    assert claim and claim.group(1) == ("is reached" if reached else "is not reached")
