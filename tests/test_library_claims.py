"""What the notebooks, quizzes and TROUBLESHOOTING.md say the pinned libraries do (issue 29, the teaching review's
findings), held against the installed libraries: each test fails the day a library stops doing what the text says."""

from __future__ import annotations

import dataclasses
import inspect
import warnings

import pytest
import torch


def test_adamw_keeps_its_moments_in_the_parameters_dtype():
    """C2: 8 bytes per parameter for fp32 weights, 4 for bf16 (notebooks 00 and 03)."""
    for dtype, nbytes in ((torch.float32, 8), (torch.bfloat16, 4)):
        p = torch.nn.Parameter(torch.ones(10, dtype=dtype))
        opt = torch.optim.AdamW([p], lr=1e-3)
        p.grad = torch.ones_like(p)
        opt.step()
        state = opt.state[p]
        assert state["exp_avg"].dtype == dtype and state["exp_avg_sq"].dtype == dtype
        assert (state["exp_avg"].element_size() + state["exp_avg_sq"].element_size()) == nbytes


def test_bitsandbytes_pages_mlp_adapters_of_an_8b_model_and_no_qkvo_adapter():
    """C1: the threshold in bitsandbytes' source, and the counts paging() prints for notebook 03."""
    from bitsandbytes.optim.optimizer import Optimizer8bit

    from course_utils.estimate import BNB_PAGE_MIN, model_shapes
    from course_utils.chapter.efficient_optimizers import paging

    assert "p.numel() < 1e5" in inspect.getsource(Optimizer8bit) and BNB_PAGE_MIN == 10**5
    s = model_shapes("llama-3.1-8b")
    assert 16 * s.hidden < BNB_PAGE_MIN <= 16 * s.intermediate
    text = paging("llama-3.1-8b")
    assert "on q/k/v/o: 256 tensors" in text and "elements: 0 paged" in text
    assert f"(MLP too): {7 * 2 * s.layers} tensors" in text and f"elements: {3 * s.layers} paged" in text


def test_trl_casts_a_quantized_models_adapters_to_bf16_and_never_upcasts():
    """C3, C4, C7: SFTTrainer makes trainable parameters of a quantized model bf16, whatever bf16/fp16 say, and
    never calls prepare_model_for_kbit_training (notebooks 05, 08, 09; TROUBLESHOOTING's fp16 entry)."""
    from trl.trainer import sft_trainer

    source = inspect.getsource(sft_trainer)
    cast = source[source.index("if _is_quantized_model:"):][:400]
    assert "param.requires_grad" in cast and "param.data.to(torch.bfloat16)" in cast and "args.fp16" not in cast
    assert "prepare_model_for_kbit_training" not in source


def test_the_loss_scaler_has_no_cpu_error_for_bf16_gradients():
    """The fp16 entry's message comes from the CUDA kernel only: on a CPU the same unscale of bf16 gradients
    runs, which is why the guide quotes it from the source (a Library message) and not from a producer."""
    grads = [torch.ones(3, dtype=torch.bfloat16)]
    torch._amp_foreach_non_finite_check_and_unscale_(grads, torch.zeros(1), torch.full((1,), 0.5))
    assert grads[0].tolist() == [0.5, 0.5, 0.5]


def test_transformers_5_checkpointing_names():
    """C5, C21: activation_checkpointing* are the current names; gradient_checkpointing* still run, warned."""
    from transformers import TrainingArguments

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = TrainingArguments(output_dir="unused", gradient_checkpointing=True, use_cpu=True, report_to="none")
    assert old.activation_checkpointing
    assert any(issubclass(w.category, FutureWarning) and "gradient_checkpointing" in str(w.message) for w in caught)


def test_trl_packing_defaults_and_liger_deprecation():
    """C11, C12: trl packs only when asked, and its default strategy is bfd; C6: use_liger_kernel is deprecated."""
    from trl import SFTConfig
    from trl.trainer import sft_trainer

    defaults = {f.name: f.default for f in dataclasses.fields(SFTConfig)}
    assert defaults["packing"] is False and defaults["packing_strategy"] == "bfd"
    assert "`use_liger_kernel=True` is deprecated" in inspect.getsource(sft_trainer)


@pytest.mark.parametrize("mask, gqa", [(None, True), (torch.ones(1, 1, 4, 4, dtype=torch.bool), False)])
def test_sdpa_gets_grouped_query_attention_only_without_a_mask(mask, gqa):
    """C9: transformers passes enable_gqa only when there is no attention mask (the course's packed rows)."""
    from transformers.integrations.sdpa_attention import use_gqa_in_sdpa

    key = value = torch.zeros(1, 2, 4, 64)
    assert use_gqa_in_sdpa(mask, key, value) is gqa


def test_accelerate_deprecates_sharding_strategy_for_reshard_after_forward():
    """C24: what notebook 11 says of the shipped FSDP1 config's key."""
    from accelerate.utils import dataclasses as acc

    assert "sharding_strategy is deprecated in favor of reshard_after_forward" in inspect.getsource(acc)
