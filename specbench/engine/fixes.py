"""Repairs for known defects of the installed vLLM that would make a cell measure a bug, not a method.

Each repair probes the running engine for its defect and is applied only where
the probe finds it, so a vLLM that has the upstream fix is measured untouched.
The names of the repairs applied are recorded in every row (``vllm_fixes``),
and ``engine.vllm_fixes=false`` measures the installed vLLM as it is: that is
how the report's distribution check is shown catching the defect
(docs/results/2026-12-02-sampling-check.md).

Runs inside an engine worker, after ``LLM()`` has registered the platform's
kernels (the CPU build registers its C++ stand-ins for vLLM's Triton kernels
while the engine starts).
"""

from __future__ import annotations

from typing import Any

# vllm-project/vllm issue 55005 (fix proposed in PR 55006, open as of vLLM 0.32):
# the CPU build's stand-in for rejection_sampler.expand_kernel casts the output
# buffer to int64, so the C++ kernel fills a temporary copy and the float32
# temperature and top_p (and int32 top_k) expanded per draft token stay
# uninitialised memory. Every sampled speculative step then divides the target's
# logits by garbage: acceptance collapses to ~1 token per pass and the output is
# drawn from the wrong distribution. Greedy decoding never expands and is unaffected.
CPU_EXPAND_KERNEL = "vllm#55005"


def apply() -> tuple[str, ...]:
    """Apply every repair whose defect this engine has; return their names (empty: none needed)."""
    applied = []
    if _expand_is_defective():
        from vllm.v1.sample import rejection_sampler

        # expand_batch_to_tokens, its one caller, looks _expand up in its module at each call. (vLLM's own
        # register_kernels cannot swap the kernel a second time: its scan of sys.modules trips on objects
        # the engine has loaded by then.)
        rejection_sampler._expand = _expand_at_caller_dtype
        if _expand_is_defective():
            raise RuntimeError(f"specbench could not repair {CPU_EXPAND_KERNEL}: expand_batch_to_tokens still "
                               "loses its output; set engine.vllm_fixes=false to measure vLLM as it is")
        applied.append(CPU_EXPAND_KERNEL)
    return tuple(applied)


def _expand_is_defective() -> bool:
    """Expand per-request temperatures and top-k values to draft tokens as the rejection sampler does, on the
    engine's own platform; wrong values (or a crash of the CPU build's stand-in) mean the defect.

    The defect is the CPU build's: on any other platform the expand is vLLM's Triton kernel, which the
    probe does not touch. (Probing it with CPU tensors, as an earlier version did, makes Triton reject
    their pointers; that error read as the defect, and GPU engines were "repaired" with a host-synchronising
    repeat_interleave and a false ``vllm_fixes`` line.)
    """
    import torch

    try:
        from vllm.platforms import current_platform
        from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens
    except ImportError:  # a vLLM without this code path has nothing of this defect to repair
        return False
    if not current_platform.is_cpu():
        return False
    cumulative = torch.tensor([2, 5], dtype=torch.int32, device=current_platform.device_type)
    try:
        temperature = expand_batch_to_tokens(torch.tensor([0.7, 0.0], device=cumulative.device), cumulative, 5,
                                             replace_from=0, replace_to=1)
        top_k = expand_batch_to_tokens(torch.tensor([50, 20], dtype=torch.int32, device=cumulative.device),
                                       cumulative, 5)
    # On the CPU build, a stand-in kernel that cannot run is as defective as one that writes nothing.
    except Exception:  # noqa: BLE001
        return True
    return (temperature.tolist() != [torch.tensor(0.7).item()] * 2 + [1.0] * 3
            or top_k.tolist() != [50, 50, 20, 20, 20])


def _expand_at_caller_dtype(output: Any, input_val: Any, cu_num_tokens: Any, replace_from: Any,
                            replace_to: Any) -> None:
    """``rejection_sampler._expand``'s contract in torch, written into ``output`` at its own dtype (as PR 55006 does):
    request i's value, with ``replace_from`` rewritten to ``replace_to``, repeated over its draft tokens."""
    import torch

    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()].copy_(expanded.to(output.dtype))
