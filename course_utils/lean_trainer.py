"""Recipe(lean_host=True): trl's SFTTrainer without the host waiting for the GPU inside a micro-batch (issue 31).

At micro-batch 1 an 8B QLoRA step is bound by the host: Python launches the kernels while the GPU idles. Every
`.item()` (or `if tensor:`) in between stops the host until the GPU has caught up, so the next kernels start late.
The pinned stack does that several times per micro-batch, for logging only (read in the installed wheels):

- trl 1.16's `SFTTrainer.compute_loss` computes the entropy, top-1 accuracy and token count of every micro-batch
  and reads each with `.item()` (and tests `num_valid > 0` on a tensor) at once;
- transformers' training loop checks each micro-batch's loss with `torch.isnan(...) or torch.isinf(...)` unless
  `logging_nan_inf_filter=False` (build.sft_config passes that with lean_host);
- with `activation_offloading=True`, trl's offloader empties CUDA's cache at *every* micro-batch whenever bitsandbytes
  is imported (its fix for a QLoRA leak), so the next micro-batch allocates through cudaMalloc again.

LeanSFTTrainer keeps trl's loss (the same code path, the same numbers) and trl's logged metrics, but keeps each
micro-batch's metrics on the device and reads them all with one transfer when the Trainer logs (once per optimizer
step at logging_steps=1); with activation offloading it empties the cache once per optimizer step instead of once per
micro-batch. Unsloth does the same in its trainer (it drops the metrics and the NaN gate); this keeps the metrics.
What it does not remove: waits inside the model (trl's fused LM head indexes `hidden_states[mask]`, a data-dependent
shape) and the optimizer step's. scripts/gpu/count_launches.py counts what remains.

Measured on the H200 (2026-12-03, scripts/gpu/logs/counts-20261203/, Llama-3.1-8B, "+ Liger kernels" at 1 x 16): waits
per micro-batch 14 -> 7, the same kernels and losses; but those waits cost the host 0.4 ms of a 400 ms micro-batch
(the GPU is idle by then: the step is bound by the host's 28,000 operator calls), and tokens/s did not move beyond the
spread between processes. Off by default: it keeps the metrics and costs nothing, but bought no speed there.
"""

from __future__ import annotations

import contextlib
from trl import SFTTrainer

METRICS = ("entropy", "mean_token_accuracy")  # trl's per-micro-batch metrics, averaged over a logging interval


class _CacheOncePerStep:
    """Stands in for trl's offloader's `device_module` (torch.cuda): passes everything through, except that
    `empty_cache()` runs only while `allow` is set (the first micro-batch of an optimizer step)."""

    def __init__(self, module):
        self._module, self.allow = module, True

    def empty_cache(self) -> None:
        if self.allow:
            self._module.empty_cache()

    def __getattr__(self, name):
        return getattr(self._module, name)


class LeanSFTTrainer(SFTTrainer):
    """SFTTrainer whose micro-batches never wait for the GPU on its own account (see the module's docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lean_pending: dict[str, list] = {"train": [], "eval": []}
        self._lean_micro = 0  # micro-batches trained (training_step calls)
        offloader = self.maybe_activation_offload_context
        self._lean_cache = None
        if not isinstance(offloader, contextlib.nullcontext) and hasattr(offloader, "device_module"):
            self._lean_cache = offloader.device_module = _CacheOncePerStep(offloader.device_module)

    def _lean_path(self, model, return_outputs: bool) -> bool:
        """True where compute_loss is trl's plain fused-head loss, which this class reproduces; everything else
        (evaluation, a custom loss, label smoothing, MoE aux loss, sequence parallelism, outputs wanted) goes to
        trl's own compute_loss unchanged."""
        parallel = getattr(self.accelerator, "parallelism_config", None)
        return (model.training and not return_outputs and self.compute_loss_func is None
                and self.label_smoother is None and self.args.loss_type in ("nll", "dft")
                and not self.aux_loss_enabled and not (parallel is not None and getattr(parallel, "sp_enabled", False)))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not self._lean_path(model, return_outputs):
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        import torch

        # trl 1.16 SFTTrainer.compute_loss, the plain branch, line for line
        inputs["use_cache"] = False
        outputs = model(**inputs, fused_lm_head=True)
        per_token_loss = -outputs.log_probs  # zero on ignored positions
        if self.args.loss_type == "dft":
            per_token_loss = per_token_loss * outputs.log_probs.exp().detach()
        num_tokens = outputs.label_mask.sum() if num_items_in_batch is None else num_items_in_batch
        loss = per_token_loss.sum() / torch.as_tensor(num_tokens).clamp(min=1)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())
        # trl's metrics, kept on the device: read in log(), all micro-batches with one transfer
        with torch.no_grad():
            gather = self.accelerator.gather_for_metrics
            num_valid = gather(outputs.label_mask.sum()).sum()
            entropy_sum = gather(outputs.entropy.detach().sum()).sum()
            num_correct = gather(outputs.is_top1.sum()).sum()
            some = num_valid > 0
            safe = num_valid.clamp(min=1)
            zero = torch.zeros((), device=safe.device)
            if "attention_mask" in inputs:
                tokens = gather(inputs["attention_mask"].sum()).sum()
            elif "position_ids" in inputs:
                tokens = gather(torch.tensor(inputs["position_ids"].size(1), device=inputs["position_ids"].device)).sum()
            else:
                raise ValueError("Expected 'attention_mask' or 'position_ids' in inputs.")
            self._lean_pending["train"].append(torch.stack([
                torch.where(some, entropy_sum / safe, zero).double(),
                torch.where(some, num_correct / safe, zero).double(), tokens.double()]))
        return loss

    def _lean_flush(self, mode: str) -> None:
        """Read the micro-batches' metrics kept on the device (one transfer) into trl's _metrics, as trl would have."""
        pending = self._lean_pending[mode]
        if not pending:
            return
        import torch

        rows = torch.stack(pending).cpu().tolist()
        pending.clear()
        for entropy, accuracy, tokens in rows:
            self._metrics[mode]["entropy"].append(entropy)
            self._metrics[mode]["mean_token_accuracy"].append(accuracy)
            self._total_train_tokens += int(tokens) // self._tp_size
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]

    def training_step(self, *args, **kwargs):
        if self._lean_cache is not None:  # empty the cache at the first micro-batch of each optimizer step only
            self._lean_cache.allow = self._lean_micro % max(1, self.args.gradient_accumulation_steps) == 0
        self._lean_micro += 1
        return super().training_step(*args, **kwargs)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        self._lean_flush("train" if self.model.training else "eval")
        super().log(logs, start_time)
