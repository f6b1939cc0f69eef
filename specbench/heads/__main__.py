"""``python -m specbench.heads train``: self-distil EAGLE / EAGLE-3 heads for a target.

    python -m specbench.heads train --method eagle eagle3 --target embedded:smollm2-135m-instruct

writes ``<out>/<target>-<method>/`` (``config.json``, ``model.safetensors``,
``manifest.json``) in the format vLLM loads. The heads shipped with specbench
were made by this command with ``--out specbench/heads/shipped``: each
``manifest.json`` holds its command and seed, and a warm-started head's also
the earlier head's (under ``warm_start``), so the same commands reproduce them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from specbench.heads import HEADS_CACHE_HINT, default_output_dir, head_name, human
from specbench.heads.train import TrainSettings

if TYPE_CHECKING:
    from specbench.engine import EngineSpec
    from specbench.engine.worker import VllmEngine
    from specbench.heads.human import HumanPrompt


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and train; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m specbench.heads", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    corpus_args = argparse.ArgumentParser(add_help=False)
    corpus_args.add_argument("--target", default="embedded:smollm2-135m-instruct",
                             help="the target: an embedded:<name> model, a local folder or a hub id")
    corpus_args.add_argument("--chat-prompts", type=int, default=human.CHAT_PROMPTS, help="ShareGPT user turns")
    corpus_args.add_argument("--condense-prompts", type=int, default=human.CONDENSE_PROMPTS,
                             help="condense a Wikipedia or news passage")
    corpus_args.add_argument("--passage-prompts", type=int, default=human.PASSAGE_PROMPTS,
                             help="questions over two or three passages")
    corpus_args.add_argument("--max-new-tokens", type=int, default=128, help="answer length")
    corpus_args.add_argument("--seed", type=int, default=0)
    corpus_args.add_argument("--threads", type=int, default=None,
                             help="torch threads (default: torch's); 1 is far faster on a machine other work shares")
    sub.add_parser("data", parents=[corpus_args],
                   help="only decode the target's answers and read its states (cached; what train reads)")
    train = sub.add_parser("train", parents=[corpus_args], help="train draft heads for a target")
    train.add_argument("--method", nargs="+", choices=["eagle", "eagle3"], default=["eagle3"])
    train.add_argument("--out", type=Path, default=None, help=f"parent folder of the heads (default: {HEADS_CACHE_HINT})")
    train.add_argument("--epochs", type=int, default=TrainSettings.epochs)
    train.add_argument("--lr", type=float, default=None,
                       help="peak learning rate (default: 2e-3; EAGLE-1 3e-4)")
    train.add_argument("--steps", type=int, default=TrainSettings.steps,
                       help="chained draft steps trained on the head's own outputs (at least the K served)")
    train.add_argument("--eval-k", type=int, default=TrainSettings.eval_k, help="K of the held-out chain-drafting estimate")
    train.add_argument("--draft-vocab-size", type=int, default=None,
                       help="EAGLE-3's reduced vocabulary (default: chosen by held-out coverage)")
    train.add_argument("--loss", choices=["hard", "soft"], default=TrainSettings.loss,
                       help="soft: cross-entropy against the target's distribution (SpecForge); hard: its greedy token")
    train.add_argument("--prompt-weight", type=float, default=TrainSettings.prompt_weight,
                       help="weight of step 0's loss in the prompts (the target's distribution at human-written text; "
                            "0: answers only)")
    train.add_argument("--warm-start", default=None,
                       help="a head (folder or heads:<name>) whose weights start training (rows of a new draft vocabulary "
                            "from the target's embedding)")
    train.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16",
                       help="storage dtype of the checkpoint (vLLM casts to the engine's dtype)")
    verify = sub.add_parser("verify", help="load a head in vLLM and check every tensor came from its file")
    verify.add_argument("head", help="the head's folder or a heads:<name> reference")
    verify.add_argument("--method", choices=["eagle", "eagle3"], required=True)
    verify.add_argument("--target", default="embedded:smollm2-135m-instruct")
    hashes = sub.add_parser("shingles", help="hash the 8-word shingles of Spec-Bench's question.jsonl into the "
                                              "package (what decontamination checks training text against)")
    hashes.add_argument("question_jsonl", type=Path,
                        help="data/spec_bench/question.jsonl of a Spec-Bench checkout (github.com/hemingkx/Spec-Bench)")
    args = parser.parse_args(argv)
    if problems := _argument_problems(args):
        print(f"error: {'; '.join(problems)}", file=sys.stderr)
        return 2
    if args.command == "verify":
        return _verify(args)
    if args.command == "shingles":
        if not args.question_jsonl.is_file():
            print(f"error: {args.question_jsonl}: no such file (Spec-Bench's data/spec_bench/question.jsonl)",
                  file=sys.stderr)
            return 2
        return _shingles(args.question_jsonl)
    if args.command == "data":
        return _data(args)
    return _train(args, argv if argv is not None else sys.argv[1:])


def _argument_problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with the command line, found before the target loads (an engine, minutes of training).

    A checkpoint that is neither embedded, shipped, a hub id nor a folder on disk, and numbers out of range.
    """
    from specbench import hub, models

    problems = []
    references = [("--target", getattr(args, "target", None)), ("head", getattr(args, "head", None))]
    for what, reference in references:
        if reference is None or models.is_embedded(reference) or models.is_shipped_head(reference) \
                or hub.is_hub_id(reference) or Path(reference).expanduser().is_dir():
            continue
        problems.append(f"{what} {reference}: no such directory (a checkpoint folder, embedded:<name>, "
                        "heads:<name> or a hub id)")
    for name in ("epochs", "steps", "eval_k", "max_new_tokens"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            problems.append(f"--{name.replace('_', '-')} {value} must be an integer >= 1")
    for name in ("chat_prompts", "condense_prompts", "passage_prompts"):
        value = getattr(args, name, None)
        if value is not None and value < 0:
            problems.append(f"--{name.replace('_', '-')} {value} must be an integer >= 0")
    lr = getattr(args, "lr", None)
    if lr is not None and not lr > 0:
        problems.append(f"--lr {lr} must be > 0")
    return problems


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


@dataclass
class _Corpus:
    """The training data (:mod:`specbench.heads.human`) with the target's answers and states, and its record."""

    prompts: list[HumanPrompt]
    examples: list[Any]
    seconds: float
    record: dict[str, Any]


def _target_engine_generator(folder: str, max_new_tokens: int) -> Callable[[list[list[int]]], list[list[int]]]:
    """The target's greedy answers, from vLLM started at the first call (a fully cached corpus needs no engine)."""
    engine: list[VllmEngine] = []

    def generate(prompts: list[list[int]]) -> list[list[int]]:
        if not engine:
            engine.append(_target_engine(folder, max_model_len=2048))
        return [list(r.token_ids) for r in engine[0].generate(prompts, max_new_tokens)]

    return generate


def _human_corpus(args: argparse.Namespace, folder: str, tokenizer: Any, model: Any, shape: Any) -> _Corpus:
    from specbench.heads import decontamination
    from specbench.heads.features import cached_examples, encode
    from specbench.results.provenance import static_provenance

    started = time.perf_counter()
    prompts = human.training_prompts(args.chat_prompts, args.condense_prompts, args.passage_prompts, args.seed)
    checked = decontamination.overlap(p.text for p in prompts)
    if checked.hits:
        raise SystemExit(f"{len(checked.hits)} training prompts share an 8-word phrase with an evaluation set")
    ids = [encode(tokenizer, p.text) for p in prompts]
    print(f"data: {len(prompts)} human-written prompts ({len(ids)} requests, {sum(map(len, ids))} prompt tokens); "
          f"the target answers them (vLLM, greedy, float32, up to {args.max_new_tokens} tokens), cached per chunk")
    identity = json.dumps([Path(folder).name, args.max_new_tokens, "vllm greedy float32",
                           static_provenance()["vllm_version"], list(shape.aux_layers())])
    examples = cached_examples(ids, _target_engine_generator(folder, args.max_new_tokens), model,
                               aux_layers=shape.aux_layers(), cache=default_output_dir() / "data", identity=identity,
                               groups=[p.kind for p in prompts])
    record = {
        "corpus": "human",
        "sources": human.sources(),
        "kinds": {kind: sum(p.kind == kind for p in prompts) for kind in ("chat", "condense", "passages")},
        "split": "by document: a conversation or article is held out by a hash of its name "
                 f"({human.HELD_OUT_SHARE:.0%}); held-out prompts quote only held-out documents",
        "documents": len({d for p in prompts for d in p.documents}),
        "held_out_documents": len({d for p in prompts if p.held_out for d in p.documents}),
        "decontamination": {"texts": checked.texts, "shingles": checked.shingles,
                            "evaluation_shingles": checked.evaluation_shingles, "hits": len(checked.hits),
                            "against": ["specbench/workloads/data/*.jsonl", decontamination.SPEC_BENCH_SOURCE]},
    }
    return _Corpus(prompts, examples, time.perf_counter() - started, record)


def _load(args: argparse.Namespace) -> tuple[str, dict[str, Any], Any, Any, _Corpus]:
    """The target (folder, config, shape, model) and its corpus, answered and read."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specbench import models
    from specbench.heads.modules import TargetShape

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = models.resolve(args.target)
    target_config = json.loads((Path(folder) / "config.json").read_text())
    shape = TargetShape.from_config(target_config)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    data = _human_corpus(args, folder, tokenizer, model, shape)
    return folder, target_config, shape, model, data


def _data(args: argparse.Namespace) -> int:
    *_, data = _load(args)
    tokens = sum(len(e.answer) for e in data.examples)
    print(f"data: {len(data.examples)} prompts, {tokens} answer tokens ready in {data.seconds:.0f} s")
    return 0


def _train(args: argparse.Namespace, argv: list[str]) -> int:
    import torch
    import transformers

    from specbench.heads.features import fingerprint
    from specbench.heads.train import head_config, save, train
    from specbench.results.provenance import static_provenance

    folder, target_config, shape, model, data = _load(args)
    examples = data.examples
    records = [{"id": p.id, "kind": p.kind, "text": p.text, "answer": e.answer.tolist()}
               for p, e in zip(data.prompts, examples)]
    data_fingerprint = fingerprint(records)
    answer_tokens = sum(len(e.answer) for e in examples)
    print(f"data: {len(examples)} prompts, {answer_tokens} answer tokens, "
          f"{sum(len(e.tokens) for e in examples)} positions in {data.seconds:.0f} s; fingerprint {data_fingerprint[:16]}")

    train_set = [e for e, p in zip(examples, data.prompts) if not p.held_out]
    held_out = [e for e, p in zip(examples, data.prompts) if p.held_out]
    target_state = {k: v.detach() for k, v in model.state_dict().items()}
    del model
    out = args.out or default_output_dir()
    command = "python -m specbench.heads " + " ".join(shlex.quote(a) for a in argv)
    for method in args.method:
        chosen: dict[str, Any] = {"lr": args.lr} if args.lr is not None else {}
        if args.draft_vocab_size is not None:
            chosen["draft_vocab_size"] = args.draft_vocab_size
        settings = TrainSettings.for_method(method, steps=args.steps, eval_k=args.eval_k, epochs=args.epochs,
                                            seed=args.seed, loss=args.loss,
                                            prompt_weight=args.prompt_weight, **chosen)
        name = head_name(Path(folder).name, method)
        warm = _warm_start(args.warm_start, method) if args.warm_start else None
        state_dir = default_output_dir() / "training" / f"{name}-{data_fingerprint[:12]}-{_settings_key(settings, args)}"
        head, result = train(method, shape, target_state, train_set, held_out, settings,
                             warm_start=warm, state_dir=state_dir)
        manifest = {
            "method": method,
            "target": args.target,
            "target_shape": shape.__dict__,
            "command": command,
            "seed": args.seed,
            "settings": result.settings.__dict__,
            "data": {
                **data.record,
                "fingerprint": data_fingerprint,
                "prompts": len(examples),
                "train_prompts": len(train_set),
                "held_out_prompts": len(held_out),
                "answer_tokens": answer_tokens,
                "max_new_tokens": args.max_new_tokens,
                # This run's time to ready its data: answers an earlier run cached are read, not redone.
                "data_seconds": round(data.seconds, 1),
            },
            "draft_vocabulary": result.vocabulary,
            "warm_start": _warm_start_record(args.warm_start) if args.warm_start else None,
            "held_out": {
                "acceptance_length": round(result.acceptance_length, 4),
                "k": settings.eval_k,
                "accepted_per_position": [round(p, 4) for p in result.accepted_per_position],
                "epoch": result.best_epoch,
            },
            "curve": [{k: round(v, 4) for k, v in point.items()} for point in result.curve],
            "training_seconds": round(result.seconds, 1),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "vllm": static_provenance()["vllm_version"], "python": platform.python_version()},
            "storage_dtype": args.dtype,
        }
        config = head_config(method, target_config, shape,
                             result.settings.draft_vocab_size if method == "eagle3" else None)
        save(out / name, head, config, manifest, getattr(torch, args.dtype))
        digest = _file_sha256(out / name / "model.safetensors")[:16]
        print(f"{method}: held-out acceptance length {result.acceptance_length:.2f} at K={settings.eval_k} "
              f"(epoch {result.best_epoch}; per position {', '.join(f'{p:.2f}' for p in result.accepted_per_position)}); "
              f"trained in {result.seconds:.0f} s; wrote {out / name} (sha256 {digest})")
    return 0


def _settings_key(settings: TrainSettings, args: argparse.Namespace) -> str:
    """What makes a training run the same run (for resuming it): its settings and warm start."""
    return hashlib.sha256(json.dumps([settings.__dict__, args.warm_start], sort_keys=True).encode()).hexdigest()[:12]


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _warm_start_record(reference: str) -> dict[str, Any]:
    """What a warm-started head grew from: the earlier head's file hash and how that head was made.

    A warm start makes a head depend on an earlier one, so reproducing it is two
    commands: the earlier head's (its manifest's ``command``, its data
    ``fingerprint`` to check the answers against), then this one with
    ``--warm-start`` pointing at that output.
    """
    from specbench import models

    folder = Path(models.resolve(reference))
    earlier = json.loads((folder / "manifest.json").read_text()) if (folder / "manifest.json").is_file() else {}
    return {
        "reference": reference,
        "sha256": _file_sha256(folder / "model.safetensors"),
        "command": earlier.get("command"),
        "data_fingerprint": earlier.get("data", {}).get("fingerprint"),
        "held_out_acceptance_length": earlier.get("held_out", {}).get("acceptance_length"),
        "warm_start": earlier.get("warm_start"),
    }


def _warm_start(reference: str, method: str) -> dict[str, Any]:
    """A head's tensors (and EAGLE-3's draft vocabulary as target ids) to start training from."""
    from safetensors.torch import load_file

    from specbench import models

    tensors = load_file(str(Path(models.resolve(reference)) / "model.safetensors"))
    if method == "eagle3" and "d2t" not in tensors:
        raise SystemExit(f"--warm-start {reference}: no d2t, not an EAGLE-3 head")
    return tensors


if __name__ == "__main__":
    raise SystemExit(main())
