"""MemoryTracker on plain torch tensors: exact byte counts by category, peak, budget, views, devices."""

from __future__ import annotations

import gc

import pytest
import torch

from course_utils.common import CATEGORIES
from course_utils.memtrack import (PHASE_CATEGORY, BudgetExceeded, MemoryTracker, model_state_tensors,
                                   optimizer_state_tensors, tensor_bytes)

N = 1024  # float32 elements: 4 KiB


def nonzero(tracker):
    return {k: v for k, v in tracker.current.items() if v}


@pytest.mark.parametrize("phase", sorted(PHASE_CATEGORY))
def test_allocation_counts_exact_bytes_in_the_phase_category(phase):
    tracker = MemoryTracker("cpu")
    tracker.phase = phase
    with tracker:
        x = torch.empty(N, dtype=torch.float32)
    assert tracker.total == N * 4
    assert nonzero(tracker) == {PHASE_CATEGORY[phase]: N * 4}
    del x


def test_tensors_made_outside_the_mode_are_not_counted():
    tracker = MemoryTracker("cpu")
    x = torch.ones(N)
    with tracker:
        pass
    assert tracker.total == 0
    del x


def test_freeing_brings_the_total_back_and_keeps_the_peak():
    tracker = MemoryTracker("cpu")
    tracker.phase = "forward"
    with tracker:
        keep = torch.zeros(N)  # 4096 bytes
        tmp = torch.zeros(2 * N, dtype=torch.float64)  # 16384 bytes
        assert tracker.total == 4096 + 16384
        del tmp
        gc.collect()
        assert tracker.total == 4096
    assert tracker.peak == 4096 + 16384
    assert tracker.peak_by_category["activations"] == 4096 + 16384
    del keep
    gc.collect()
    assert tracker.total == 0
    assert tracker.current == dict.fromkeys(CATEGORIES, 0)
    assert tracker.peak == 4096 + 16384  # the peak is remembered


def test_peak_by_category_is_the_split_at_the_peak():
    tracker = MemoryTracker("cpu")
    with tracker:
        tracker.phase = "forward"
        act = torch.zeros(N)  # 4096 activations
        tracker.phase = "after_forward"
        tmp = torch.zeros(N)  # 4096 temporaries -> peak 8192
        del tmp
        gc.collect()
        tracker.phase = "idle"
        small = torch.zeros(N // 2)  # 2048 other: total 6144 < peak
    assert tracker.peak == 8192
    assert tracker.peak_by_category == {**dict.fromkeys(CATEGORIES, 0), "activations": 4096, "temporaries": 4096}
    assert tracker.current["other"] == 2048
    del act, small


def test_reset_peak():
    tracker = MemoryTracker("cpu")
    with tracker:
        keep = torch.zeros(N)
        tmp = torch.zeros(4 * N)
        del tmp
        gc.collect()
    assert tracker.peak == 5 * 4 * N
    tracker.reset_peak()
    assert tracker.peak == tracker.total == 4 * N
    assert tracker.peak_by_category == tracker.current
    del keep


def test_classify_moves_bytes_without_changing_the_total():
    tracker = MemoryTracker("cpu")
    tracker.phase = "after_forward"
    with tracker:
        g = torch.ones(N)
        a = torch.ones(2 * N)
    total = tracker.total
    tracker.classify([g], "gradients")
    assert tracker.total == total
    assert nonzero(tracker) == {"gradients": 4 * N, "temporaries": 8 * N}
    tracker.classify([g, a], "optimizer")
    assert tracker.total == total
    assert nonzero(tracker) == {"optimizer": 12 * N}
    del g, a


def test_classify_starts_tracking_new_tensors_and_skips_non_tensors():
    tracker = MemoryTracker("cpu")
    w = torch.zeros(N)
    tracker.classify([w, None, 3, torch.empty(10, device="meta")], "parameters")
    assert tracker.total == 4 * N
    assert nonzero(tracker) == {"parameters": 4 * N}
    del w
    gc.collect()
    assert tracker.total == 0


def test_views_are_not_counted_twice():
    tracker = MemoryTracker("cpu")
    tracker.phase = "forward"
    with tracker:
        x = torch.zeros(N)
        views = [x.view(32, 32), x[10:], x.reshape(2, -1), x.view(32, 32).t(), x.as_strided((4,), (2,))]
        x.add_(1)  # in-place: same storage
        assert tracker.total == 4 * N
    tracker.classify(views, "parameters")  # classifying a view moves the storage, once
    assert tracker.total == 4 * N
    assert nonzero(tracker) == {"parameters": 4 * N}
    del views
    gc.collect()
    assert tracker.total == 4 * N  # the base still holds the storage
    del x
    gc.collect()
    assert tracker.total == 0


def test_budget_raises_budget_exceeded_an_out_of_memory_error():
    assert issubclass(BudgetExceeded, torch.OutOfMemoryError)
    tracker = MemoryTracker("cpu", budget_bytes=6 * N)
    with tracker:
        a = torch.zeros(N)  # 4096 <= 6144: fine
        with pytest.raises(torch.OutOfMemoryError) as exc:
            b = torch.zeros(N)  # 8192 > 6144  # noqa: F841
    assert isinstance(exc.value, BudgetExceeded)
    assert "budget" in str(exc.value)
    del a


def test_budget_also_applies_to_classify():
    tracker = MemoryTracker("cpu", budget_bytes=N)
    with pytest.raises(BudgetExceeded):
        tracker.classify([torch.zeros(N)], "parameters")


def test_other_device_types_are_ignored():
    tracker = MemoryTracker(device_type="cuda")
    tracker.phase = "forward"
    with tracker:
        x = torch.zeros(N) * 2
    tracker.classify([x], "parameters")
    assert tracker.total == 0
    assert tracker.peak == 0
    assert nonzero(tracker) == {}


def test_a_real_step_splits_into_categories():
    """A tiny forward/backward/Adam step, tracked the way measure.py does it."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(8, 64)
    model(x).sum().backward()
    opt.step()  # creates the optimizer state before tracking
    opt.zero_grad(set_to_none=True)

    tracker = MemoryTracker("cpu")
    tracker.classify(model_state_tensors(model), "parameters")
    tracker.classify(optimizer_state_tensors(opt), "optimizer")
    param_bytes = (64 * 64 + 64) * 4
    assert tracker.current["parameters"] == param_bytes
    assert tracker.current["optimizer"] >= 2 * param_bytes  # exp_avg and exp_avg_sq (plus step counters)
    with tracker:
        tracker.phase = "forward"
        loss = model(x).sum()
        tracker.phase = "after_forward"
        loss.backward()
        tracker.classify([p.grad for p in model.parameters()], "gradients")
    assert tracker.current["gradients"] == param_bytes
    assert tracker.peak_by_category["activations"] > 0
    del loss


def test_tensor_bytes_counts_distinct_storages():
    a = torch.zeros(N)
    b = torch.zeros(N, dtype=torch.float16)
    assert tensor_bytes([a, a.view(2, -1), a[1:], b]) == 4 * N + 2 * N


def test_model_state_tensors_include_buffers():
    model = torch.nn.BatchNorm1d(16)
    tensors = model_state_tensors(model)
    assert len(tensors) == len(list(model.parameters())) + len(list(model.buffers()))
    assert tensor_bytes(tensors) == sum(t.untyped_storage().nbytes() for t in tensors)
