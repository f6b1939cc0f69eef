"""Workload loading: every source, its errors, length filtering and seeded selection."""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import os
import random
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from specbench.workloads import (
    NAMES,
    Prompt,
    PromptLengths,
    Workload,
    WorkloadError,
    check_source,
    estimated_requests,
    load_prompts,
    load_workload,
    prompt_lengths,
    validate_workload_config,
)
from specbench.workloads.tokens import CHAT_TEMPLATE_TOKENS, FileTokenizer

TOKENIZER_DIR = Path.home() / ".cache" / "specbench" / "models" / "smollm2-135m-instruct"
WORKLOAD_CONF = Path(__file__).resolve().parents[1] / "conf" / "workload"


def make_cfg(**overrides: Any) -> dict[str, Any]:
    """A valid builtin config, with the given keys replaced."""
    cfg: dict[str, Any] = {
        "name": "summarize",
        "source": "builtin",
        "path": None,
        "num_prompts": 2,
        "seed": 0,
        "max_tokens": 16,
        "max_prompt_tokens": 4096,
        "chat_template": False,
    }
    cfg.update(overrides)
    return cfg


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def spec_bench_record(question_id: int, category: str, *turns: str) -> dict[str, Any]:
    return {"question_id": question_id, "category": category, "turns": list(turns)}


SPEC_BENCH_RECORDS = [
    spec_bench_record(81, "writing", "Write a travel blog post.", "Rewrite it in limericks."),
    spec_bench_record(91, "roleplay", "Pretend to be Elon Musk.", "Now dance with me."),
    spec_bench_record(101, "reasoning", "Who finished second?", "And third?"),
    spec_bench_record(161, "translation", "Translate: Guten Morgen."),
    spec_bench_record(241, "summarization", "Summarize: the council met on Tuesday."),
    spec_bench_record(242, "summarization", "Summarize: rain is expected tomorrow."),
    spec_bench_record(401, "rag", "Passages: ... Question: when did it open?"),
]


@pytest.fixture()
def spec_bench_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "question.jsonl", SPEC_BENCH_RECORDS)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    if not (TOKENIZER_DIR / "tokenizer.json").is_file():
        pytest.skip(f"embedded model's tokenizer not found at {TOKENIZER_DIR} (run `make setup`)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)


def numbered_prompts_file(tmp_path: Path, count: int) -> Path:
    return write_jsonl(
        tmp_path / "numbered.jsonl",
        [{"id": f"p{i:02d}", "prompt": f"Prompt {i}: say something about {i}."} for i in range(count)],
    )


class TestBuiltin:
    @pytest.mark.parametrize("name", NAMES)
    def test_each_builtin_has_at_least_32_distinct_prompts(self, name: str) -> None:
        prompts, fingerprint = load_prompts(make_cfg(name=name))
        assert len(prompts) >= 32
        assert len({p.id for p in prompts}) == len(prompts)
        assert all(p.text.strip() for p in prompts)
        data = (importlib.resources.files("specbench.workloads") / "data" / f"{name}.jsonl").read_bytes()
        assert fingerprint == hashlib.sha256(data).hexdigest()

    @pytest.mark.parametrize("name", NAMES)
    def test_shipped_config_is_valid_and_loads(self, name: str, tokenizer: Any) -> None:
        cfg = OmegaConf.load(WORKLOAD_CONF / f"{name}.yaml")
        assert validate_workload_config(cfg) == []
        workload = load_workload(cfg, tokenizer)
        assert workload.name == name and workload.source == "builtin"
        assert len(workload.prompts) == cfg.num_prompts == len(workload.token_ids)
        assert all(len(ids) <= cfg.max_prompt_tokens for ids in workload.token_ids)


class TestJsonl:
    def test_reads_custom_fields_skips_blank_lines_and_numbers_missing_ids(self, tmp_path: Path) -> None:
        path = tmp_path / "mine.jsonl"
        path.write_text(
            '{"key": "a", "question": "First?"}\n'
            "\n"
            '{"question": "Second?"}\n'
            "   \n"
            '{"key": 7, "question": "Third?", "extra": 1}\n',
            encoding="utf-8",
        )
        cfg = make_cfg(source="jsonl", path=str(path), prompt_field="question", id_field="key")
        prompts, fingerprint = load_prompts(cfg)
        assert prompts == [Prompt("a", "First?"), Prompt("3", "Second?"), Prompt("7", "Third?")]
        assert fingerprint == hashlib.sha256(path.read_bytes()).hexdigest()

    def test_default_fields_are_prompt_and_id(self, tmp_path: Path) -> None:
        path = write_jsonl(tmp_path / "p.jsonl", [{"id": "x", "prompt": "Hello"}])
        assert load_prompts(make_cfg(source="jsonl", path=str(path)))[0] == [Prompt("x", "Hello")]

    def test_malformed_line_names_file_and_line(self, tmp_path: Path) -> None:
        path = tmp_path / "broken.jsonl"
        path.write_text('{"prompt": "ok"}\n\n{"prompt": "oops"\n', encoding="utf-8")
        with pytest.raises(WorkloadError, match=r"broken\.jsonl:3: malformed JSON"):
            load_prompts(make_cfg(source="jsonl", path=str(path)))

    def test_an_unterminated_string_is_named_with_one_at(self, tmp_path: Path) -> None:
        path = tmp_path / "cut.jsonl"
        path.write_text('{"prompt": "cut short\n', encoding="utf-8")
        with pytest.raises(WorkloadError) as caught:
            load_prompts(make_cfg(source="jsonl", path=str(path)))
        assert str(caught.value) == f"{path}:1: malformed JSON line (Unterminated string starting at column 12)"

    def test_line_that_is_not_an_object_is_rejected(self, tmp_path: Path) -> None:
        path = write_jsonl(tmp_path / "list.jsonl", [{"prompt": "ok"}, ["not", "an", "object"]])
        with pytest.raises(WorkloadError, match=r"list\.jsonl:2: expected a JSON object"):
            load_prompts(make_cfg(source="jsonl", path=str(path)))

    def test_missing_prompt_field_names_file_line_and_field(self, tmp_path: Path) -> None:
        path = write_jsonl(tmp_path / "p.jsonl", [{"text": "a"}, {"text": "b"}])
        with pytest.raises(WorkloadError, match=r"p\.jsonl:1: missing prompt field 'question'"):
            load_prompts(make_cfg(source="jsonl", path=str(path), prompt_field="question"))

    def test_non_string_prompt_is_rejected(self, tmp_path: Path) -> None:
        path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}, {"prompt": 42}])
        with pytest.raises(WorkloadError, match=r"p\.jsonl:2: field 'prompt' must be a non-empty"):
            load_prompts(make_cfg(source="jsonl", path=str(path)))

    def test_duplicate_ids_are_rejected(self, tmp_path: Path) -> None:
        path = write_jsonl(tmp_path / "p.jsonl", [{"id": 1, "prompt": "a"}, {"id": "1", "prompt": "b"}])
        with pytest.raises(WorkloadError, match=r"duplicate prompt id '1' at line 1 and line 2"):
            load_prompts(make_cfg(source="jsonl", path=str(path)))

    def test_empty_file_gives_no_prompts_error(self, tmp_path: Path) -> None:
        path = tmp_path / "empty.jsonl"
        path.write_text("\n\n", encoding="utf-8")
        with pytest.raises(WorkloadError, match=r"no prompts for workload rag in .*empty\.jsonl"):
            load_prompts(make_cfg(name="rag", source="jsonl", path=str(path)))

    def test_missing_file_is_a_workload_error(self, tmp_path: Path) -> None:
        with pytest.raises(WorkloadError, match=r"workload\.path=.*nope\.jsonl.* does not exist"):
            load_prompts(make_cfg(source="jsonl", path=str(tmp_path / "nope.jsonl")))


class TestEstimatedRequests:
    """What the sweep's plan prices before any tokenizer: count and mean length in tokens."""

    def test_lengths_from_characters_and_the_prompt_cap_as_loading_applies_it(self, tmp_path: Path) -> None:
        path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a" * n} for n in (450, 900, 9000)])
        cfg = make_cfg(source="jsonl", path=str(path), max_prompt_tokens=1000)
        # 9000 characters is about 2000 tokens, over the cap: left out, as loading would.
        assert estimated_requests(cfg) == (2, 150.0)
        count, mean = estimated_requests(make_cfg(source="jsonl", path=str(path), num_prompts="all"))
        assert (count, mean) == (3, pytest.approx((100 + 200 + 2000) / 3))

    def test_none_where_the_prompts_are_not_read_before_an_engine(self, tmp_path: Path) -> None:
        assert estimated_requests(make_cfg(source="hf")) is None
        assert estimated_requests(make_cfg(source="jsonl", path=str(tmp_path / "missing.jsonl"))) is None


class TestPromptLengths:
    """The token lengths validation prices and counts, before any engine or torch."""

    @pytest.mark.parametrize("name", NAMES)
    def test_the_tokenizers_files_give_the_runs_token_ids(self, name: str, tokenizer: Any) -> None:
        files = FileTokenizer(TOKENIZER_DIR)
        for prompt in load_prompts(make_cfg(name=name))[0]:
            message = [{"role": "user", "content": prompt.text}]
            assert files.apply_chat_template(message, add_generation_prompt=True, tokenize=True) == list(
                tokenizer.apply_chat_template(message, add_generation_prompt=True, tokenize=True, return_dict=False))
            assert files.encode(prompt.text) == tokenizer.encode(prompt.text, add_special_tokens=True)

    def test_measured_lengths_are_the_selected_prompts_as_the_run_tokenizes_them(self, tokenizer: Any) -> None:
        cfg = make_cfg(num_prompts=32, max_prompt_tokens=1536, chat_template=True)
        lengths = prompt_lengths(cfg, str(TOKENIZER_DIR))
        assert lengths == PromptLengths(tuple(len(ids) for ids in load_workload(cfg, tokenizer).token_ids), exact=True)
        assert (min(lengths.tokens), max(lengths.tokens)) == (419, 965)

    def test_without_a_tokenizer_each_prompt_is_bounded_by_its_bytes(self, tmp_path: Path) -> None:
        texts = ["a" * 100, "é" * 100, "b" * 5000, "c" * 10]  # é: 2 bytes
        path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": t} for t in texts])
        cfg = make_cfg(source="jsonl", path=str(path), num_prompts=3, max_prompt_tokens=1000, chat_template=True)
        lengths = prompt_lengths(cfg, str(tmp_path / "no-model"))
        # The 3 longest bounds a draw could pick, a prompt over the cap counted at the cap (it is skipped).
        assert lengths == PromptLengths((1000, 200 + CHAT_TEMPLATE_TOKENS, 100 + CHAT_TEMPLATE_TOKENS), exact=False)
        assert prompt_lengths(make_cfg(source="hf"), str(TOKENIZER_DIR)) is None

    def test_too_few_prompts_within_the_cap_are_refused_with_the_counts(self, tokenizer: Any) -> None:
        cfg = make_cfg(num_prompts=32, max_prompt_tokens=512, chat_template=True)
        assert check_source(cfg, str(TOKENIZER_DIR)) == [
            "workload.num_prompts=32 but only 9 prompts of summarize (source=builtin) fit "
            "workload.max_prompt_tokens=512 (29 of 38 are longer with this model's tokenizer); "
            "lower workload.num_prompts or raise workload.max_prompt_tokens (a serving cell takes a prompt per "
            "request, raising workload.num_prompts to load.num_requests: load.cycle_prompts=true cycles fewer)"
        ]
        assert check_source({**cfg, "num_prompts": 9}, str(TOKENIZER_DIR)) == []

    def test_a_malformed_file_is_refused_with_or_without_a_tokenizer(self, tmp_path: Path) -> None:
        path = tmp_path / "bad.jsonl"
        path.write_text('{"prompt": "fine"}\n{"prompt": oops}\n', encoding="utf-8")
        cfg = make_cfg(source="jsonl", path=str(path), num_prompts=1)
        for model in (str(TOKENIZER_DIR), str(tmp_path / "no-model")):
            [problem] = check_source(cfg, model)
            assert f"{path}:2: malformed JSON line" in problem


class TestSpecBench:
    @pytest.mark.parametrize(
        ("name", "ids"),
        [("summarize", ["241", "242"]), ("rag", ["401"]), ("creative", ["81", "91"])],
    )
    def test_categories_map_to_workloads(self, spec_bench_file: Path, name: str, ids: list[str]) -> None:
        cfg = make_cfg(name=name, source="spec_bench", path=str(spec_bench_file))
        prompts, fingerprint = load_prompts(cfg)
        assert [p.id for p in prompts] == ids
        assert fingerprint == hashlib.sha256(spec_bench_file.read_bytes()).hexdigest()

    def test_text_is_the_first_turn_unless_turn_says(self, spec_bench_file: Path) -> None:
        cfg = make_cfg(name="creative", source="spec_bench", path=str(spec_bench_file))
        first = ["Write a travel blog post.", "Pretend to be Elon Musk."]
        assert [p.text for p in load_prompts(cfg)[0]] == first
        cfg["turn"] = 1
        second = ["Rewrite it in limericks.", "Now dance with me."]
        assert [p.text for p in load_prompts(cfg)[0]] == second

    def test_turn_past_the_last_names_the_line(self, spec_bench_file: Path) -> None:
        cfg = make_cfg(name="summarize", source="spec_bench", path=str(spec_bench_file), turn=1)
        expected = r"question\.jsonl:5: workload\.turn=1 but 'turns' has 1 turns"
        with pytest.raises(WorkloadError, match=expected):
            load_prompts(cfg)

    def test_explicit_categories_override_the_mapping(self, spec_bench_file: Path) -> None:
        categories = ["translation", "reasoning"]
        cfg = make_cfg(source="spec_bench", path=str(spec_bench_file), categories=categories)
        assert [p.id for p in load_prompts(cfg)[0]] == ["101", "161"]

    def test_explicit_categories_from_an_omegaconf_list(self, spec_bench_file: Path) -> None:
        categories = ["rag", "translation"]
        cfg = OmegaConf.create(
            make_cfg(name="rag", source="spec_bench", path=str(spec_bench_file), categories=categories)
        )
        assert [p.id for p in load_prompts(cfg)[0]] == ["161", "401"]

    def test_unknown_category_lists_the_known_ones(self, spec_bench_file: Path) -> None:
        categories = ["rag", "poetry"]
        cfg = make_cfg(name="rag", source="spec_bench", path=str(spec_bench_file), categories=categories)
        with pytest.raises(WorkloadError, match=r"unknown Spec-Bench categories poetry") as info:
            load_prompts(cfg)
        for known in ("coding", "math_reasoning", "summarization", "writing"):
            assert known in str(info.value)

    def test_no_matching_category_is_an_empty_selection(self, tmp_path: Path) -> None:
        records = [r for r in SPEC_BENCH_RECORDS if r["category"] != "rag"]
        path = write_jsonl(tmp_path / "question.jsonl", records)
        expected = r"no prompts for workload rag in .*question\.jsonl \(categories rag\)"
        with pytest.raises(WorkloadError, match=expected):
            load_prompts(make_cfg(name="rag", source="spec_bench", path=str(path)))

    def test_record_without_turns_names_the_line(self, tmp_path: Path) -> None:
        records = [SPEC_BENCH_RECORDS[0], {"question_id": 1, "category": "rag"}]
        path = write_jsonl(tmp_path / "q.jsonl", records)
        with pytest.raises(WorkloadError, match=r"q\.jsonl:2: missing Spec-Bench field 'turns'"):
            load_prompts(make_cfg(name="rag", source="spec_bench", path=str(path)))


HF_CFG = {
    "source": "hf",
    "dataset": "cnn_dailymail",
    "dataset_config": "3.0.0",
    "split": "test",
    "text_field": "article",
    "instruction": "Summarize the following article in a few sentences.",
}


class TestHuggingFace:
    def test_without_datasets_installed_says_how_to_fix(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # A None entry in sys.modules makes `import datasets` raise ImportError
        # whether or not the package is installed.
        monkeypatch.setitem(sys.modules, "datasets", None)
        with pytest.raises(WorkloadError) as info:
            load_prompts(make_cfg(**HF_CFG))
        message = str(info.value)
        assert "pip install datasets" in message
        assert "cnn_dailymail" in message
        assert "source=jsonl" in message and "source=spec_bench" in message

    def test_offline_failure_is_wrapped_and_forces_offline_mode(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        seen: dict[str, str | None] = {}

        def load_dataset(name: str, config: str | None, split: str) -> Any:
            seen["hub"] = os.environ.get("HF_HUB_OFFLINE")
            seen["datasets"] = os.environ.get("HF_DATASETS_OFFLINE")
            raise ConnectionError("Couldn't reach 'cnn_dailymail' on the Hub (LocalEntryNotFoundError)")

        monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
        expected = r"cannot load dataset cnn_dailymail \(3\.0\.0\) split test"
        with pytest.raises(WorkloadError, match=expected) as info:
            load_prompts(make_cfg(**HF_CFG))
        assert "source=jsonl" in str(info.value)
        assert seen == {"hub": "1", "datasets": "1"}
        assert "HF_DATASETS_OFFLINE" not in os.environ

    def test_rows_become_instruction_plus_text(self, monkeypatch: pytest.MonkeyPatch) -> None:
        rows = [{"id": "a1", "article": "The council met."}, {"id": "b2", "article": "Rain is due."}]
        calls: list[tuple[str, str | None, str]] = []

        def load_dataset(name: str, config: str | None, split: str) -> Any:
            calls.append((name, config, split))
            return rows

        monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
        prompts, fingerprint = load_prompts(make_cfg(**HF_CFG))
        assert calls == [("cnn_dailymail", "3.0.0", "test")]
        assert fingerprint == ""
        assert prompts == [
            Prompt("a1", "Summarize the following article in a few sentences.\n\nThe council met."),
            Prompt("b2", "Summarize the following article in a few sentences.\n\nRain is due."),
        ]

    def test_missing_text_field_names_dataset_and_field(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def load_dataset(name: str, config: str | None, split: str) -> Any:
            return [{"id": "a1", "highlights": "x"}]

        monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
        with pytest.raises(WorkloadError, match=r"cnn_dailymail.*row 0: no field 'article'"):
            load_prompts(make_cfg(**HF_CFG))


class TestValidate:
    def test_valid_config_has_no_messages(self, tmp_path: Path) -> None:
        assert validate_workload_config(make_cfg()) == []
        path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "x"}])
        assert validate_workload_config(OmegaConf.create(make_cfg(source="jsonl", path=str(path)))) == []
        assert validate_workload_config(make_cfg(**HF_CFG)) == []

    @pytest.mark.parametrize(
        ("overrides", "expected"),
        [
            ({"name": "poems"}, "workload.name='poems' is not one of summarize, rag, creative (the built-in"),
            ({**HF_CFG, "name": "news/daily"}, "workload.name='news/daily' must be letters, digits, _ and -"),
            ({**HF_CFG, "name": None}, "workload.name=None must be letters, digits, _ and -"),
            ({"source": "foo"}, "workload.source='foo' is not one of builtin, spec_bench, jsonl, hf"),
            ({"source": "jsonl"}, "workload.path is required for workload.source=jsonl"),
            ({"source": "spec_bench", "path": "/no/such/question.jsonl"}, "does not exist"),
            ({"path": "/tmp/x.jsonl"}, "workload.path='/tmp/x.jsonl' is only read for workload.source="),
            ({"num_prompts": 0}, "workload.num_prompts=0 must be an integer >= 1"),
            ({"max_tokens": -3}, "workload.max_tokens=-3 must be an integer >= 1"),
            ({"max_prompt_tokens": 0}, "workload.max_prompt_tokens=0 must be an integer >= 1"),
            ({"num_prompts": "8"}, "workload.num_prompts='8' must be an integer >= 1"),
            ({"num_prompts": True}, "workload.num_prompts=True must be an integer >= 1"),
            ({"num_prompts": "some"}, "workload.num_prompts='some' must be an integer >= 1 or all"),
            ({"selection": "last"}, "workload.selection='last' is not one of random, first"),
            ({"seed": 1.5}, "workload.seed=1.5 must be an integer"),
            ({"chat_template": "yes"}, "workload.chat_template='yes' must be true or false"),
            ({"prompt_field": 3}, "workload.prompt_field=3 must be a string"),
            ({"turn": -1}, "workload.turn=-1 must be an integer >= 0"),
            ({"categories": "rag"}, "workload.categories='rag' must be null or a non-empty list"),
            ({"categories": []}, "workload.categories=[] must be null or a non-empty list"),
            ({**HF_CFG, "dataset": None}, "workload.dataset=None must be a non-empty string for"),
            ({**HF_CFG, "text_field": ""}, "workload.text_field='' must be a non-empty string for"),
        ],
    )
    def test_each_bad_key_gets_one_message(self, overrides: dict[str, Any], expected: str) -> None:
        messages = validate_workload_config(make_cfg(**overrides))
        assert len(messages) == 1, messages
        assert expected in messages[0]

    def test_a_users_own_workload_has_its_own_name(self, tmp_path: Path, tokenizer: Any) -> None:
        """Only where the name picks the prompts (built-in file, Spec-Bench's default categories) is it one of NAMES."""
        path = write_jsonl(tmp_path / "tickets.jsonl", [{"id": "t1", "prompt": "Reset my password."}])
        cfg = make_cfg(name="support-tickets", source="jsonl", path=str(path), num_prompts=1)
        assert validate_workload_config(cfg) == []
        assert load_workload(cfg, tokenizer).name == "support-tickets"
        question = write_jsonl(tmp_path / "question.jsonl", [spec_bench_record(1, "math", "2 + 2?")])
        spec_bench = make_cfg(name="arithmetic", source="spec_bench", path=str(question))
        [message] = validate_workload_config(spec_bench)
        assert "set workload.categories for a workload of your own" in message
        assert validate_workload_config({**spec_bench, "categories": ["math"]}) == []

    def test_missing_keys_are_reported(self) -> None:
        messages = validate_workload_config({"name": "rag", "source": "builtin"})
        assert [m.split("=")[0] for m in messages] == [
            "workload.num_prompts",
            "workload.max_tokens",
            "workload.max_prompt_tokens",
            "workload.seed",
            "workload.chat_template",
        ]

    def test_not_a_mapping(self) -> None:
        messages = validate_workload_config(["rag"])  # type: ignore[arg-type]
        assert messages == ["workload config must be a mapping, got list"]

    def test_loaders_refuse_invalid_configs(self) -> None:
        with pytest.raises(WorkloadError, match=r"workload\.num_prompts=0"):
            load_prompts(make_cfg(num_prompts=0))


class TestSelection:
    def test_too_long_prompts_are_skipped_and_counted_not_truncated(
        self, tmp_path: Path, tokenizer: Any
    ) -> None:
        short = [{"id": f"s{i}", "prompt": f"Short prompt {i}."} for i in range(4)]
        long = [{"id": f"l{i}", "prompt": "A much longer prompt. " * 40} for i in range(3)]
        path = write_jsonl(tmp_path / "mixed.jsonl", short + long)
        cfg = make_cfg(source="jsonl", path=str(path), num_prompts=4, max_prompt_tokens=20)
        workload = load_workload(cfg, tokenizer)
        assert workload.skipped_too_long == 3
        assert sorted(workload.prompt_ids) == ["s0", "s1", "s2", "s3"]
        for prompt, ids in zip(workload.prompts, workload.token_ids):
            assert list(ids) == tokenizer.encode(prompt.text, add_special_tokens=True)

    def test_not_enough_prompts_names_the_counts(self, tmp_path: Path, tokenizer: Any) -> None:
        short = [{"id": f"s{i}", "prompt": f"Short prompt {i}."} for i in range(2)]
        long = [{"id": f"l{i}", "prompt": "A much longer prompt. " * 40} for i in range(3)]
        path = write_jsonl(tmp_path / "mixed.jsonl", short + long)
        cfg = make_cfg(source="jsonl", path=str(path), num_prompts=4, max_prompt_tokens=20)
        expected = (r"workload\.num_prompts=4 but only 2 prompts of summarize \(source=jsonl\) fit "
                    r"workload\.max_prompt_tokens=20 \(3 of 5 are longer")
        with pytest.raises(WorkloadError, match=expected):
            load_workload(cfg, tokenizer)

    def test_selection_is_seeded_and_ordered_as_drawn(self, tmp_path: Path, tokenizer: Any) -> None:
        path = numbered_prompts_file(tmp_path, 20)
        cfg = make_cfg(source="jsonl", path=str(path), num_prompts=5, seed=3)
        first = load_workload(cfg, tokenizer)
        again = load_workload(cfg, tokenizer)
        assert first == again
        source_ids = [p.id for p in load_prompts(cfg)[0]]
        assert first.prompt_ids == random.Random(3).sample(source_ids, 5)
        assert first.prompt_ids != sorted(first.prompt_ids)
        other = load_workload({**cfg, "seed": 4}, tokenizer)
        assert other.prompt_ids != first.prompt_ids

    def test_first_takes_the_source_order(self, tmp_path: Path, tokenizer: Any) -> None:
        path = numbered_prompts_file(tmp_path, 20)
        cfg = make_cfg(source="jsonl", path=str(path), num_prompts=5, selection="first")
        assert load_workload(cfg, tokenizer).prompt_ids == ["p00", "p01", "p02", "p03", "p04"]

    def test_all_keeps_every_prompt_that_fits(self, tmp_path: Path, tokenizer: Any) -> None:
        short = [{"id": f"s{i}", "prompt": f"Short prompt {i}."} for i in range(4)]
        long = [{"id": "l0", "prompt": "A much longer prompt. " * 40}]
        path = write_jsonl(tmp_path / "mixed.jsonl", short[:2] + long + short[2:])
        cfg = make_cfg(source="jsonl", path=str(path), num_prompts="all", max_prompt_tokens=20)
        assert validate_workload_config(cfg) == []
        in_order = load_workload({**cfg, "selection": "first"}, tokenizer)
        assert in_order.prompt_ids == ["s0", "s1", "s2", "s3"] and in_order.skipped_too_long == 1
        drawn = load_workload(cfg, tokenizer)  # every prompt, in a seeded order
        assert drawn.prompt_ids == random.Random(0).sample(in_order.prompt_ids, 4)

    def test_a_whole_spec_bench_category_in_file_order(self, spec_bench_file: Path, tokenizer: Any) -> None:
        cfg = make_cfg(source="spec_bench", path=str(spec_bench_file), num_prompts="all", selection="first")
        assert load_workload(cfg, tokenizer).prompt_ids == ["241", "242"]

    def test_all_with_no_prompt_that_fits_is_refused(self, tmp_path: Path, tokenizer: Any) -> None:
        path = write_jsonl(tmp_path / "long.jsonl", [{"prompt": "A much longer prompt. " * 40}])
        cfg = make_cfg(source="jsonl", path=str(path), num_prompts="all", max_prompt_tokens=20)
        with pytest.raises(WorkloadError, match=r"num_prompts=all but only 0 prompts"):
            load_workload(cfg, tokenizer)

    def test_chat_template_wraps_the_user_message(self, tmp_path: Path, tokenizer: Any) -> None:
        path = numbered_prompts_file(tmp_path, 3)
        cfg = make_cfg(source="jsonl", path=str(path), num_prompts=3)
        plain = load_workload(cfg, tokenizer)
        templated = load_workload({**cfg, "chat_template": True}, tokenizer)
        assert plain.prompt_ids == templated.prompt_ids
        # The template's text before the user's content, tokenized on its own.
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": "\x00"}], add_generation_prompt=True, tokenize=False
        )
        head, tail = rendered.split("\x00")
        head_ids = tokenizer.encode(head, add_special_tokens=False)
        tail_ids = tokenizer.encode(tail, add_special_tokens=False)
        for prompt, plain_ids, ids in zip(templated.prompts, plain.token_ids, templated.token_ids):
            assert ids != plain_ids
            assert list(ids[: len(head_ids)]) == head_ids
            assert list(ids[len(ids) - len(tail_ids) :]) == tail_ids
            assert list(ids[len(head_ids) : len(ids) - len(tail_ids)]) == tokenizer.encode(
                prompt.text, add_special_tokens=False
            )

    def test_chat_template_result_as_a_mapping_is_normalised(self, tmp_path: Path) -> None:
        class DictTokenizer:
            """Returns what transformers 5 returns when return_dict is ignored."""

            def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any:
                ids = [7, 8, len(conversation[0]["content"])]
                return {"input_ids": ids, "attention_mask": [1, 1, 1]}

            def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
                return [1]

        path = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "prompt": "four"}])
        cfg = make_cfg(source="jsonl", path=str(path), num_prompts=1, chat_template=True)
        workload = load_workload(cfg, DictTokenizer())
        assert workload == Workload(
            name="summarize",
            source="jsonl",
            prompts=(Prompt("a", "four"),),
            token_ids=((7, 8, 4),),
            skipped_too_long=0,
            source_fingerprint=hashlib.sha256(path.read_bytes()).hexdigest(),
        )
