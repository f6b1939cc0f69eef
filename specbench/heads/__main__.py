"""``python -m specbench.heads train``: self-distil EAGLE / EAGLE-3 heads for a target.

    python -m specbench.heads train --method eagle eagle3 --target embedded:smollm2-135m-instruct

writes ``<out>/<target>-<method>/`` (``config.json``, ``model.safetensors``,
``manifest.json``) in the format vLLM loads. The heads shipped with specbench
were made by exactly this command with ``--out specbench/heads/shipped`` (see
each ``manifest.json``); the same command and seed reproduce them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specbench.heads import HEADS_CACHE_HINT, default_output_dir, head_name
from specbench.heads.train import TrainSettings

if TYPE_CHECKING:
    from specbench.engine import EngineSpec
    from specbench.engine.worker import VllmEngine


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and train; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m specbench.heads", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train draft heads for a target")
    train.add_argument("--method", nargs="+", choices=["eagle", "eagle3"], default=["eagle", "eagle3"])
    train.add_argument("--target", default="embedded:smollm2-135m-instruct",
                       help="the target: an embedded:<name> model, a local folder or a hub id")
    train.add_argument("--out", type=Path, default=None, help=f"parent folder of the heads (default: {HEADS_CACHE_HINT})")
    train.add_argument("--direct-prompts", type=int, default=384)
    train.add_argument("--source-prompts", type=int, default=120)
    train.add_argument("--reading-prompts", type=int, default=240)
    train.add_argument("--max-new-tokens", type=int, default=128, help="answer length of direct and reading prompts")
    train.add_argument("--source-tokens", type=int, default=256,
                       help="length of the source documents that reading prompts quote")
    train.add_argument("--epochs", type=int, default=TrainSettings.epochs)
    train.add_argument("--lr", type=float, default=None,
                       help="peak learning rate (default: 2e-3; EAGLE-1 3e-4)")
    train.add_argument("--steps", type=int, default=3, help="chained draft steps trained on the head's own outputs")
    train.add_argument("--eval-k", type=int, default=4, help="K of the held-out chain-drafting estimate")
    train.add_argument("--draft-vocab-size", type=int, default=4096, help="EAGLE-3's reduced vocabulary")
    train.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16",
                       help="storage dtype of the checkpoint (vLLM casts to the engine's dtype)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--threads", type=int, default=None,
                       help="torch threads (default: torch's); 1 is far faster on a machine other work shares")
    verify = sub.add_parser("verify", help="load a head in vLLM and check every tensor came from its file")
    verify.add_argument("head", help="the head's folder or a heads:<name> reference")
    verify.add_argument("--method", choices=["eagle", "eagle3"], required=True)
    verify.add_argument("--target", default="embedded:smollm2-135m-instruct")
    hashes = sub.add_parser("shingles", help="hash the 8-word shingles of Spec-Bench's question.jsonl into the "
                                              "package (what decontamination checks training text against)")
    hashes.add_argument("question_jsonl", type=Path,
                        help="data/spec_bench/question.jsonl of a Spec-Bench checkout (github.com/hemingkx/Spec-Bench)")
    args = parser.parse_args(argv)
    if args.command == "verify":
        return _verify(args)
    if args.command == "shingles":
        return _shingles(args.question_jsonl)
    return _train(args, argv if argv is not None else sys.argv[1:])


def _shingles(question_jsonl: Path) -> int:
    from specbench.heads import decontamination

    out = Path(__file__).parent / decontamination.SPEC_BENCH_FILE
    count = decontamination.write_spec_bench(question_jsonl, out)
    print(f"{count} shingle hashes of {question_jsonl} -> {out}; update SPEC_BENCH_SOURCE with its commit")
    return 0


def _verify(args: argparse.Namespace) -> int:
    import os

    from specbench import models
    from specbench.engine import worker_environment
    from specbench.engine.worker import loaded_drafter_parameters
    from specbench.heads.train import compare_with_file

    folder = models.resolve(args.head)
    spec = _cpu_target_spec(
        models.resolve(args.target), max_model_len=256, max_num_seqs=1, cpu_kvcache_space_gib=1,
        speculative_config_json=json.dumps({"method": args.method, "model": folder, "num_speculative_tokens": 1}),
    )
    os.environ.update(worker_environment(spec))
    loaded = loaded_drafter_parameters(spec)
    problems = compare_with_file(loaded, Path(folder))
    for problem in problems:
        print(f"{folder}: {problem}")
    if not problems:
        print(f"{folder}: all {len(loaded)} tensors of the {args.method} head vLLM loaded equal its file")
    return 1 if problems else 0


def _cpu_target_spec(folder: str, **fields: Any) -> EngineSpec:
    """The target as the sweeps run it on CPU (float32, eager, no prefix cache), plus ``fields``."""
    from specbench.engine import EngineSpec

    return EngineSpec(model=folder, dtype="float32", seed=0, enforce_eager=True, enable_prefix_caching=False,
                      gpu_memory_utilization=0.9, **fields)


def _target_engine(folder: str, max_model_len: int) -> VllmEngine:
    """The target in vLLM, in this process, for decoding the training answers."""
    import os

    from specbench.engine import worker_environment
    from specbench.engine.worker import VllmEngine

    spec = _cpu_target_spec(folder, max_model_len=max_model_len, max_num_seqs=128, cpu_kvcache_space_gib=4)
    os.environ.update(worker_environment(spec))
    return VllmEngine(spec)


def _train(args: argparse.Namespace, argv: list[str]) -> int:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specbench import models
    from specbench.heads import corpus
    from specbench.heads.features import Example, encode, states
    from specbench.heads.modules import TargetShape
    from specbench.heads.train import head_config, save, split_held_out, train
    from specbench.results.provenance import static_provenance

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = models.resolve(args.target)
    target_config = json.loads((Path(folder) / "config.json").read_text())
    shape = TargetShape.from_config(target_config)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    started = time.perf_counter()

    engine = None

    def answer(prompts: list[corpus.TrainingPrompt], desc: str, max_new_tokens: int) -> list[Example]:
        nonlocal engine
        if engine is None:
            engine = _target_engine(folder, max_model_len=2048)
        ids = [encode(tokenizer, p.text) for p in prompts]
        print(f"{desc}: the target answers {len(ids)} prompts (vLLM, greedy, up to {max_new_tokens} tokens)")
        answers = [r.token_ids for r in engine.generate(ids, max_new_tokens)]
        return states(model, ids, answers, aux_layers=shape.aux_layers(), desc=desc)

    # The target's answers are the slow part; both methods (and reruns) share one copy.
    key = hashlib.sha256(json.dumps(
        [args.target, args.direct_prompts, args.source_prompts, args.reading_prompts, args.max_new_tokens,
         args.source_tokens, args.seed, corpus.template_texts(), "answers: vllm"]).encode()).hexdigest()[:16]
    data_file = default_output_dir() / f"data-{key}.pt"
    if data_file.is_file():
        saved = torch.load(data_file, weights_only=False)
        prompts, examples, data_seconds = saved["prompts"], saved["examples"], saved["seconds"]
        print(f"data: reusing {data_file}")
    else:
        direct = corpus.direct_prompts(args.direct_prompts, args.seed)
        sources = corpus.source_prompts(args.source_prompts, args.seed)
        source_examples = answer(sources, "source documents", args.source_tokens)
        documents = [tokenizer.decode(e.answer, skip_special_tokens=True).strip() for e in source_examples]
        reading = corpus.reading_prompts(documents, args.reading_prompts, args.seed)
        prompts = direct + sources + reading
        examples = (answer(direct, "direct prompts", args.max_new_tokens) + source_examples
                    + answer(reading, "reading prompts", args.max_new_tokens))
        data_seconds = time.perf_counter() - started
        del engine
        data_file.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"prompts": prompts, "examples": examples, "seconds": data_seconds}, data_file)
    records = [{"id": p.id, "kind": p.kind, "text": p.text, "answer": e.answer.tolist()}
               for p, e in zip(prompts, examples)]
    data_fingerprint = corpus.fingerprint(records)
    answer_tokens = sum(len(e.answer) for e in examples)
    print(f"data: {len(examples)} prompts, {answer_tokens} answer tokens, "
          f"{sum(len(e.tokens) for e in examples)} positions in {data_seconds:.0f} s; fingerprint {data_fingerprint[:16]}")

    train_set, held_out = split_held_out(examples, 0.1, args.seed)
    target_state = {k: v.detach() for k, v in model.state_dict().items()}
    out = args.out or default_output_dir()
    command = "python -m specbench.heads " + " ".join(shlex.quote(a) for a in argv)
    for method in args.method:
        chosen = {"lr": args.lr} if args.lr is not None else {}
        settings = TrainSettings.for_method(method, steps=args.steps, eval_k=args.eval_k, epochs=args.epochs,
                                            draft_vocab_size=args.draft_vocab_size, seed=args.seed, **chosen)
        head, result = train(method, shape, target_state, train_set, held_out, settings)
        name = head_name(Path(folder).name, method)
        manifest = {
            "method": method,
            "target": args.target,
            "target_shape": shape.__dict__,
            "command": command,
            "seed": args.seed,
            "settings": settings.__dict__,
            "data": {
                "fingerprint": data_fingerprint,
                "prompts": len(examples),
                "train_prompts": len(train_set),
                "held_out_prompts": len(held_out),
                "answer_tokens": answer_tokens,
                "max_new_tokens": args.max_new_tokens,
                "source_tokens": args.source_tokens,
                "generation_seconds": round(data_seconds, 1),
            },
            "held_out": {
                "acceptance_length": round(result.acceptance_length, 4),
                "k": settings.eval_k,
                "accepted_per_position": [round(p, 4) for p in result.accepted_per_position],
            },
            "curve": [{k: round(v, 4) for k, v in point.items()} for point in result.curve],
            "training_seconds": round(result.seconds, 1),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "vllm": static_provenance()["vllm_version"], "python": platform.python_version()},
            "storage_dtype": args.dtype,
        }
        config = head_config(method, target_config, shape,
                             settings.draft_vocab_size if method == "eagle3" else None)
        save(out / name, head, config, manifest, getattr(torch, args.dtype))
        digest = hashlib.sha256((out / name / "model.safetensors").read_bytes()).hexdigest()[:16]
        print(f"{method}: held-out acceptance length {result.acceptance_length:.2f} at K={settings.eval_k} "
              f"(per position {', '.join(f'{p:.2f}' for p in result.accepted_per_position)}); "
              f"trained in {result.seconds:.0f} s; wrote {out / name} (sha256 {digest})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
