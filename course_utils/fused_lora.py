"""Recipe(fused_lora=True): each 4-bit linear, with its LoRA adapter, as one autograd function (issue 31).

At micro-batch 1 an 8B QLoRA step is bound by the host: Python dispatches operator after operator while the GPU
idles (scripts/gpu/count_launches.py counted 28,000 operator calls per micro-batch for ours, 4,400 for Unsloth, with
the same GPU work). Much of it is one projection's stack of modules and ops, run three times per micro-batch
(forward, recomputation, backward):

- peft's `lora.Linear4bit.forward`: the base layer, `result.clone()`, dropout, lora_A, lora_B, a multiply by the
  scaling and an add, each a module call or an op with its own autograd node;
- bitsandbytes' `Linear4bit.forward` -> `matmul_4bit` -> `MatMul4Bit` -> `gemm_4bit`, with their checks and casts.

Here one `torch.autograd.Function` per projection does the same arithmetic with the fewest ops: dequantize the NF4
weight (bitsandbytes' own `dequantize_4bit` op), one matmul, dropout, the two LoRA matmuls with the scaling folded
into an `addmm`; its backward dequantizes again and computes the input's and the adapter's gradients by hand. A
linear without an adapter (the MLP's, when LoRA targets attention only) gets the same without the LoRA part.

What it keeps the same, and tests/test_fused_lora.py checks on a CPU: the outputs and gradients of every projection
(to float rounding: the scaling is applied inside the matmul) and the random dropout masks (drawn the way
`torch.nn.functional.dropout` draws them). What it keeps for backward is less: the mask and lora_A's output, as
peft, but lora_A's input before the dropout, dropped out again in the backward from the mask, where peft keeps a
dropped-out copy for each linear. q, k and v read one tensor, so it is kept once (gate and up likewise), and o_proj's
is the attention's output, which the attention keeps anyway: without dropout peft shares them so too. The estimator
counts it (estimate/activations.py, lora_piece), to the byte on a CPU. What it does not support falls back to peft's
forward, per module: DoRA and other LoRA variants, several active adapters, merged or disabled adapters, a bias on
the base layer.

The idea and its shape are Unsloth's (`unsloth/kernels/fast_lora.py`, Apache-2.0: fused LoRA functions whose
backward computes the adapter gradients with `addmm`), written again here for peft's modules, one projection at a
time; nothing is copied. Taught in notebook 09 (beyond the recipe), on a CPU.

Measured on an H100 (2026-12-07, scripts/gpu/logs/fused-20261207/ and repeats-20261207/README.md): at 1 x 16 the
host's operators per micro-batch 28,213 -> 19,573 and 1.10x the tokens/s (two processes each, nothing else on the
GPU); at 16 x 1 the peak 192 MiB lower, as the estimator says, at 1.01-1.02x the tokens/s in three runs; under the
T4 profile in fp16 it runs. Its dequantize on CUDA then went through bitsandbytes' ctypes library (_dequantize_cuda):
with reentrant checkpointing at 1 x 16, 576 operators fewer and 257 -> 240 ms a micro-batch (run counts-20261207-dequant,
repeats-20261207/README.md). Off by default; the planner offers it (estimate/plan.py), with factors measured at its
picks' micro-batches (x1.01 at 16 x 1, x1.08 at 8 x 2), and picks it.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import torch



def dequantize(weight, dtype: torch.dtype) -> torch.Tensor:
    """The NF4 weight (out_features x in_features) as `dtype`: bitsandbytes' own ops, called as
    bitsandbytes.functional.dequantize_4bit calls them (the nested absmax of double quantization first), without
    its Python checks, which the weight passed when it was quantized. On CUDA the same two kernels are called
    through bitsandbytes' C library instead (_dequantize_cuda): in bf16, fp16 and fp32, with
    and without double quantization, its result equals the ops' to the bit (scripts/gpu/host_costs.py on an H100,
    2026-12-07, scripts/gpu/logs/repeats-20261207/run3/). Under torch.compile, one opaque op of its own,
    course::dequantize_4bit (below), which runs the same path inside (Dynamo cannot trace ctypes calls)."""
    state = weight.quant_state
    if torch.compiler.is_compiling():
        inner = state.state2 if state.nested else None
        return torch.ops.course.dequantize_4bit(
            weight.data, state.absmax, inner.absmax if inner else None, inner.code if inner else None,
            state.offset if inner else None, inner.blocksize if inner else 0, state.blocksize, state.quant_type,
            list(state.shape), dtype)
    if weight.device.type == "cuda" and dtype in _KERNEL_DTYPE:
        return _dequantize_cuda(weight, state, dtype)
    return _dequantize_ops(weight, state, dtype)


@torch.library.custom_op("course::dequantize_4bit", mutates_args=())
def _dequantize_op(data: torch.Tensor, absmax: torch.Tensor, absmax2: torch.Tensor | None, code2: torch.Tensor | None,
                   offset: torch.Tensor | None, blocksize2: int, blocksize: int, quant_type: str, shape: list[int],
                   dtype: torch.dtype) -> torch.Tensor:
    """dequantize as one op for torch.compile (issue 31, per-layer compile: scripts/gpu/try_step_changes.py): opaque
    to Dynamo, so a compiled layer makes one call per weight where bitsandbytes' two ops and an add each cost the
    host a dispatch (the run-5 probe, repeats-20261207/README.md), and on CUDA it takes the ctypes path. The idea of
    an NF4 dequantize as a torch.library custom op is Axolotl's (Apache-2.0); written here, nothing copied."""
    inner = SimpleNamespace(absmax=absmax2, code=code2, blocksize=blocksize2)
    state = SimpleNamespace(absmax=absmax, nested=absmax2 is not None, state2=inner, offset=offset,
                            blocksize=blocksize, quant_type=quant_type, shape=torch.Size(shape))
    if data.device.type == "cuda" and dtype in _KERNEL_DTYPE:
        return _dequantize_cuda(data, state, dtype)
    return _dequantize_ops(data, state, dtype)


@_dequantize_op.register_fake
def _(data, absmax, absmax2, code2, offset, blocksize2, blocksize, quant_type, shape, dtype):
    return data.new_empty(shape, dtype=dtype)


def _dequantize_ops(weight, state, dtype: torch.dtype) -> torch.Tensor:
    absmax = state.absmax
    if state.nested:
        inner = state.state2
        absmax = torch.ops.bitsandbytes.dequantize_blockwise.default(absmax, inner.absmax, inner.code,
                                                                     inner.blocksize, torch.float32)
        absmax += state.offset
    return torch.ops.bitsandbytes.dequantize_4bit.default(weight.data, absmax, state.blocksize, state.quant_type,
                                                          state.shape, dtype)


_KERNEL_DTYPE = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}  # bitsandbytes' names


def _dequantize_cuda(weight, state, dtype: torch.dtype) -> torch.Tensor:
    """dequantize on CUDA: the kernels bitsandbytes' CUDA backend runs for its two ops (backends/cuda/ops.py), with the
    same arguments and the same two allocations (so the same memory), called through its ctypes library without
    the torch.library dispatch around each op: 45 -> 24 us of host time per call on an H100 (scripts/gpu/host_costs.py,
    checked equal to the ops' result there). As Unsloth's fast_dequantize calls them; written here, nothing copied."""
    from bitsandbytes.cextension import lib

    stream = ctypes.c_void_p(torch._C._cuda_getCurrentRawStream(weight.device.index))
    absmax = state.absmax
    if state.nested:
        inner, packed = state.state2, absmax
        absmax = torch.empty(packed.shape, device=weight.device, dtype=torch.float32)
        lib.cdequantize_blockwise_fp32(inner.code.data_ptr(), packed.data_ptr(), inner.absmax.data_ptr(),
                                       absmax.data_ptr(), inner.blocksize, packed.numel(), stream)
        absmax += state.offset
    out = torch.empty(state.shape, device=weight.device, dtype=dtype)
    kernel = getattr(lib, f"cdequantize_blockwise_{_KERNEL_DTYPE[dtype]}_{state.quant_type}")  # nf4 or fp4
    kernel(None, weight.data.data_ptr(), absmax.data_ptr(), out.data_ptr(), state.blocksize, out.numel(), stream)
    return out


def _autocast_dtype(device: str) -> torch.dtype | None:
    """The dtype autocast gives matmuls on `device` inside this block, or None where autocast is off."""
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in `dtype`, without dispatching an operator when it already is (a no-op `.to` still costs the host one)."""
    return t if t.dtype == dtype else t.to(dtype)


def _dropout(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x with dropout p, and what its backward needs, drawn as torch.nn.functional.dropout draws it (so a run's
    masks are the ones peft's nn.Dropout would draw): on a GPU the fused kernel (a bool mask), on a CPU a noise
    tensor of x's dtype holding 0 or 1/(1-p)."""
    if x.device.type != "cpu":
        return torch.native_dropout(x, p, True)
    noise = torch.empty_like(x).bernoulli_(1 - p).div_(1 - p)
    return x * noise, noise


def _undo_dropout(grad: torch.Tensor, kept: torch.Tensor, p: float) -> torch.Tensor:
    if kept.dtype == torch.bool:
        return torch.ops.aten.native_dropout_backward(grad, kept, 1.0 / (1 - p))
    return grad * kept


class LoRA4bit(torch.autograd.Function):
    """y = x W^T + s * dropout(x) A^T B^T, with W in NF4 (dequantized on the fly, never kept), A and B the adapter.

    Dtypes as peft and bitsandbytes have them: the base matmul runs in the layer's compute dtype and returns x's
    dtype; the LoRA matmuls run in autocast's dtype where autocast is on, else in the adapter's dtype."""

    @staticmethod
    def forward(ctx, x, lora_a, lora_b, base, scaling: float, p: float):
        out_dtype = x.dtype
        device = x.device.type
        lora_dtype = _autocast_dtype(device)
        with torch.autocast(device, enabled=False):
            compute = base.compute_dtype or x.dtype
            x2 = x.reshape(-1, x.shape[-1])
            y = _as(torch.mm(_as(x2, compute), dequantize(base.weight, compute).t()), out_dtype)
            if lora_dtype is None:  # peft casts the input to the adapter's dtype when autocast is off
                lora_dtype = lora_a.dtype
                xl = _as(x2, lora_dtype)
            else:
                xl = x2
            kept, undropped = None, xl
            if p > 0:
                xl, kept = _dropout(xl, p)
            # lora_A's input is then the undropped one, dropped out again in the backward, where the mask is kept anyway
            redrop = p > 0 and xl.dtype == lora_dtype and ctx.needs_input_grad[0]
            xl = _as(xl, lora_dtype)
            a, b = _as(lora_a, lora_dtype), _as(lora_b, lora_dtype)
            xa = torch.mm(xl, a.t())  # torch.mm, not @: one operator fewer for the host each
            if y.dtype == lora_dtype:
                y = y.addmm_(xa, b.t(), alpha=scaling)
            else:
                y = y + _as(torch.mm(xa, b.t()) * scaling, y.dtype)
        # kept for backward: the dropout's mask and lora_A's output, as peft keeps them, and lora_A's input before the
        # dropout, which q, k and v (gate and up) share, where peft keeps one dropped-out copy per linear; nothing of
        # the base. (Where a cast follows the dropout, the cast copy, as peft.)
        ctx.save_for_backward(kept if ctx.needs_input_grad[0] else None, undropped if redrop else xl, xa,
                              lora_a, lora_b)
        ctx.base, ctx.scaling, ctx.p, ctx.x_dtype, ctx.redrop = base, scaling, p, x.dtype, redrop
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        kept, xl, xa, lora_a, lora_b = ctx.saved_tensors
        if ctx.redrop:  # the dropped-out input again, from the kept mask and the same scale
            xl = _undo_dropout(xl, kept, ctx.p)
        base, s = ctx.base, ctx.scaling
        shape = grad.shape
        g = grad.reshape(-1, shape[-1])
        dx = da = db = None
        with torch.autocast(grad.device.type, enabled=False):
            lora_dtype = xl.dtype
            gl = _as(g, lora_dtype)
            a, b = _as(lora_a, lora_dtype), _as(lora_b, lora_dtype)
            # (tokens, r): the gradient at lora_A's output, the scaling in it here (r columns) rather than in the
            # (tokens, in_features) products below: one small multiply in place of two big ones (128 launches fewer a
            # micro-batch at 16 x 1, the same losses and speed: run counts-20261207-inside16, README.md)
            gb = torch.mm(gl, b).mul_(s)
            if ctx.needs_input_grad[2]:
                db = _as(torch.mm(gl.t(), xa).mul_(s), lora_b.dtype)
            if ctx.needs_input_grad[1]:
                da = _as(torch.mm(gb.t(), xl), lora_a.dtype)
            if ctx.needs_input_grad[0]:
                compute = base.compute_dtype or ctx.x_dtype
                dx = _as(torch.mm(_as(g, compute), dequantize(base.weight, compute)), ctx.x_dtype)
                dxl = torch.mm(gb, a)
                if kept is not None:
                    dxl = _undo_dropout(dxl, kept, ctx.p)
                dx = dx.add_(dxl) if dxl.dtype == dx.dtype else dx + dxl.to(dx.dtype)
                dx = dx.view(*shape[:-1], dx.shape[-1])
        return dx, da, db, None, None, None


class Linear4bitOnly(torch.autograd.Function):
    """y = x W^T for a 4-bit linear without an adapter: bitsandbytes' MatMul4Bit without its checks (no bias)."""

    @staticmethod
    def forward(ctx, x, base):
        with torch.autocast(x.device.type, enabled=False):
            compute = base.compute_dtype or x.dtype
            y = _as(x, compute) @ dequantize(base.weight, compute).t()
        ctx.base, ctx.x_dtype = base, x.dtype
        return _as(y, x.dtype)

    @staticmethod
    def backward(ctx, grad):
        with torch.autocast(grad.device.type, enabled=False):
            compute = ctx.base.compute_dtype or ctx.x_dtype
            dx = _as(grad, compute) @ dequantize(ctx.base.weight, compute)
        return _as(dx, ctx.x_dtype), None


def _lora_forward(module):
    """peft's lora.Linear4bit `module` as one LoRA4bit call, falling back to peft's own forward for what it does
    not cover (checked at each call: adapters can be switched, merged or disabled after patching)."""
    peft_forward = module.forward

    def forward(x, *args, **kwargs):
        if args or kwargs or module.disable_adapters or module.merged or len(module.active_adapters) != 1:
            return peft_forward(x, *args, **kwargs)
        name = module.active_adapters[0]
        if name not in module.lora_A or name in module.lora_variant:
            return peft_forward(x, *args, **kwargs)
        dropout = module.lora_dropout[name]
        p = dropout.p if isinstance(dropout, torch.nn.Dropout) and module.training else 0.0
        return LoRA4bit.apply(x, module.lora_A[name].weight, module.lora_B[name].weight, module.base_layer,
                              float(module.scaling[name]), float(p))

    return forward


def _base_forward(module):
    bnb_forward = module.forward

    def forward(x):
        if module.bias is not None or not torch.is_grad_enabled():
            return bnb_forward(x)
        return Linear4bitOnly.apply(x, module)

    return forward


def fuse_lora(model) -> str:
    """Give every peft lora.Linear4bit in `model` the fused forward, and every 4-bit linear without an adapter the
    lean one. Returns a note saying how many of each; RecipeError when the model has no 4-bit linears."""
    import bitsandbytes as bnb
    from peft.tuners.lora.bnb import Linear4bit as LoraLinear4bit

    from course_utils.recipe import RecipeError

    lora, plain = 0, 0
    inside_lora = set()
    for module in model.modules():
        if isinstance(module, LoraLinear4bit):
            base = module.base_layer
            if isinstance(base, bnb.nn.Linear4bit) and base.bias is None:
                base.weight.quant_state  # noqa: B018 (an AttributeError here: a weight that was never quantized)
                module.forward = _lora_forward(module)
                lora += 1
            inside_lora.add(id(base))
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit) and id(module) not in inside_lora and module.bias is None:
            module.forward = _base_forward(module)
            plain += 1
    if not lora and not plain:
        raise RecipeError("fused_lora=True needs a 4-bit model (load_in_4bit=True): this one has no bitsandbytes "
                          "Linear4bit layers. Set fused_lora=False or load_in_4bit=True.")
    return f"fused LoRA: {lora} 4-bit linears with their adapter, {plain} without, one autograd function each"
