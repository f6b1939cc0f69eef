"""Hub checkpoints: found in the cache without network, downloaded once, or refused in one line before any engine.

This machine cannot reach huggingface.co, so the refusals of an unreachable hub
are real (a closed local port, and the real hub). What a reachable hub answers
(a repository's files and sizes, a gated repository's 403) comes from a small
local HTTP server speaking the hub's API, so huggingface_hub's own client and
error mapping run; only the file transfer itself (``snapshot_download``) is
replaced, since no hub can be reached from here to download from.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from specbench import config, hub, job, models
from specbench.config import cell_from_config
from specbench.sweep import plan_cells

COMMIT = "0123456789abcdef0123456789abcdef01234567"
CLOSED_PORT = "http://127.0.0.1:9"  # discard: nothing listens, every connection is refused


@pytest.fixture
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face home; the user's own offline switch and mirror cleared."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for name in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "hf"


def cache_checkpoint(home: Path, repo_id: str, files: dict[str, str | Path], *, ref: bool = True) -> Path:
    """A snapshot in the hub cache's layout: blobs linked from ``snapshots/<commit>/``, ``refs/main`` naming it.

    A value that is a path is linked as it is (the embedded model's files); a string is written as a blob.
    """
    repo = home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for name, content in files.items():
        if isinstance(content, Path):
            (snapshot / name).symlink_to(content.resolve())
        else:
            blob = repo / "blobs" / f"blob-{name}"
            blob.write_text(content)
            (snapshot / name).symlink_to(blob)
    if ref:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything asks the hub."""
    from huggingface_hub import HfApi

    monkeypatch.setattr(HfApi, "model_info", lambda *a, **k: pytest.fail("the hub was asked"))
    monkeypatch.setattr("huggingface_hub.snapshot_download", lambda *a, **k: pytest.fail("a download started"))


def test_hub_ids_are_told_from_local_and_packaged_references(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine" / "model").mkdir(parents=True)
    assert hub.is_hub_id("Qwen/Qwen2.5-7B-Instruct") and hub.is_hub_id("leptonai/EAGLE-Qwen2.5-7B-Instruct")
    for local in ("embedded:smollm2-135m-instruct", "heads:smollm2-135m-instruct-eagle", "/abs/model", "./rel/x",
                  "~/models/x", "a/b/c", "mine/model", "specbench.controlled.ControlledProposer"):
        assert not hub.is_hub_id(local), local


def test_a_cached_checkpoint_resolves_to_its_snapshot_without_network(hf_home, monkeypatch) -> None:
    snapshot = cache_checkpoint(hf_home, "Org/Small", {"config.json": "{}", "model.safetensors": "w",
                                                       "tokenizer.json": "{}"})
    no_network(monkeypatch)
    monkeypatch.setenv("HF_ENDPOINT", CLOSED_PORT)
    assert hub.fetch_all([("model.path", "Org/Small"), ("model.drafts.self", "Org/Small")]) == {"Org/Small": snapshot}
    assert models.resolve("Org/Small") == str(snapshot)
    assert hub.snapshot_revision(snapshot) == COMMIT and hub.snapshot_revision(hf_home) is None


def test_a_partial_snapshot_is_not_a_checkpoint(hf_home) -> None:
    # A tokenizer fetched alone, and a sharded checkpoint with a shard missing, are not loadable.
    cache_checkpoint(hf_home, "Org/Tok", {"config.json": "{}", "tokenizer.json": "{}"})
    index = json.dumps({"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}})
    cache_checkpoint(hf_home, "Org/Sharded", {"config.json": "{}", "model.safetensors.index.json": index,
                                              "model-1.safetensors": "w"})
    assert hub.cached_snapshot("Org/Tok") is None and hub.cached_snapshot("Org/Sharded") is None
    assert models.resolve("Org/Tok", prepare=False) == "Org/Tok"  # validation's view: not on disk, unchanged


def test_a_cache_copied_without_its_refs_still_resolves(hf_home) -> None:
    snapshot = cache_checkpoint(hf_home, "Org/Copied", {"config.json": "{}", "pytorch_model.bin": "w"}, ref=False)
    assert hub.cached_snapshot("Org/Copied") == snapshot


def test_a_missing_checkpoint_offline_is_refused_in_one_line_without_network(hf_home, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    no_network(monkeypatch)
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_all([("model.path", "embedded:smollm2-135m-instruct"), ("model.drafts.small", "Org/Draft")])
    [line] = str(caught.value).splitlines()
    assert line.startswith(f"model.drafts.small=Org/Draft is not in the Hugging Face cache ({hf_home / 'hub'}) "
                           "and HF_HUB_OFFLINE=1 forbids downloading it: unset HF_HUB_OFFLINE")
    assert "`hf download Org/Draft`" in line and "set HF_HOME to a cache that holds it" in line
    assert line.endswith("or point model.drafts.small at a local folder")


@pytest.mark.parametrize("endpoint", [CLOSED_PORT, None], ids=["closed-port", "the-real-hub"])
def test_an_unreachable_hub_is_refused_in_one_line_per_model_within_seconds(hf_home, monkeypatch, endpoint) -> None:
    # This machine has no network: the real hub is as unreachable as a closed port.
    if endpoint:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
    started = time.monotonic()
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_all([("model.path", "Org/Target"), ("model.eagle3", "Org/Head")])
    elapsed = time.monotonic() - started
    lines = str(caught.value).splitlines()
    where = endpoint or hub.DEFAULT_ENDPOINT
    assert [line.split(" is not")[0] for line in lines] == ["model.path=Org/Target", "model.eagle3=Org/Head"]
    assert all(f"the hub cannot be reached ({where}: " in line and "connect this machine" in line for line in lines)
    assert elapsed < hub.PROBE_TIMEOUT_S + 5  # one bounded probe, not huggingface_hub's minutes of retries


class FakeHub(http.server.BaseHTTPRequestHandler):
    """The hub's model API for two repositories: one open, one gated (every access check answers 403)."""

    repos: dict[str, dict[str, Any]] = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?")[0]
        # /api/models/<id>, its /auth-check, or /api/models/<id>/revision/<commit> (huggingface_hub's pinned lookup).
        repo_id = path.removeprefix("/api/models/").removesuffix("/auth-check").split("/revision/")[0]
        repo = self.repos.get(repo_id)
        if repo is None:
            self._answer(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        elif path.endswith("/auth-check") and repo["gated"]:
            self._answer(403, {"error": "Access to this model is restricted"}, {"X-Error-Code": "GatedRepo"})
        else:
            self._answer(200, repo)

    def _answer(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


SIBLINGS = [("config.json", 700), ("generation_config.json", 200), ("tokenizer.json", 7_000_000),
            ("tokenizer_config.json", 3_000), ("model-00001-of-00002.safetensors", 4_000_000_000),
            ("model-00002-of-00002.safetensors", 1_000_000_000), ("model.safetensors.index.json", 30_000),
            ("pytorch_model.bin", 5_000_000_000), ("original/consolidated.00.pth", 5_000_000_000),
            ("README.md", 5_000), ("LICENSE", 7_000)]


@pytest.fixture
def fake_hub(hf_home, monkeypatch) -> Iterator[str]:
    """A local hub (HF_ENDPOINT) holding Org/Open (5 GB of safetensors) and Org/Gated."""
    siblings = [{"rfilename": name, "size": size} for name, size in SIBLINGS]
    FakeHub.repos = {repo: {"id": repo, "modelId": repo, "sha": COMMIT, "private": False, "gated": gated,
                            "siblings": siblings}
                     for repo, gated in (("Org/Open", False), ("Org/Gated", "manual"))}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HF_ENDPOINT", url)
    yield url
    server.shutdown()


def test_a_checkpoints_files_are_its_weights_config_and_tokenizer() -> None:
    assert sorted(hub.checkpoint_files(SIBLINGS)) == [
        "config.json", "generation_config.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"]
    only_bin = [(n, s) for n, s in SIBLINGS if not n.endswith(".safetensors")]
    assert "pytorch_model.bin" in hub.checkpoint_files(only_bin)


def test_a_download_the_disk_cannot_hold_is_refused_before_it_starts(fake_hub, hf_home, monkeypatch) -> None:
    class Usage:
        free = 2_000_000_000

    monkeypatch.setattr(hub.shutil, "disk_usage", lambda path: Usage())
    monkeypatch.setattr("huggingface_hub.snapshot_download", lambda *a, **k: pytest.fail("a download started"))
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_all([("model.path", "Org/Open")])
    [line] = str(caught.value).splitlines()
    assert line == (f"not enough disk for the models to download: 5.0 GB needed (Org/Open 5.0 GB), 2.0 GB free "
                    f"under {hf_home / 'hub'}; free some space, or set HF_HOME (or HF_HUB_CACHE) to a larger disk")


def test_a_missing_checkpoint_is_downloaded_once_with_only_the_files_it_needs(fake_hub, hf_home, monkeypatch,
                                                                             capsys) -> None:
    calls: list[dict[str, Any]] = []

    def download(repo_id: str, **kwargs: Any) -> str:  # the transfer: no hub to download from here
        calls.append(dict(kwargs, repo_id=repo_id))
        shards = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
        files = {name: json.dumps({"weight_map": shards}) if name.endswith("index.json") else "x"
                 for name in kwargs["allow_patterns"]}
        return str(cache_checkpoint(Path(kwargs["cache_dir"]).parent, repo_id, files))

    monkeypatch.setattr("huggingface_hub.snapshot_download", download)
    found = hub.fetch_all([("model.path", "Org/Open")])
    assert found == {"Org/Open": hf_home / "hub" / "models--Org--Open" / "snapshots" / COMMIT}
    [call] = calls
    assert call["endpoint"] == fake_hub and call["cache_dir"] == hf_home / "hub"
    assert call["allow_patterns"] == sorted(hub.checkpoint_files(SIBLINGS))
    assert f"downloading Org/Open (model.path): 5.0 GB into {hf_home / 'hub'}" in capsys.readouterr().err
    assert hub.fetch_all([("model.path", "Org/Open")]) == found and len(calls) == 1  # cached now: no second download


def test_a_gated_checkpoint_without_access_says_how_to_get_it(fake_hub, monkeypatch) -> None:
    # The 403 a gated repository answers is the fake hub's, its mapping to GatedRepoError huggingface_hub's own.
    monkeypatch.setattr("huggingface_hub.snapshot_download", lambda *a, **k: pytest.fail("a download started"))
    with pytest.raises(hub.HubError) as caught:
        hub.fetch_all([("model.path", "Org/Open"), ("model.eagle", "Org/Gated"), ("model.eagle3", "Org/Typo")])
    gated, typo = str(caught.value).splitlines()
    assert gated == ("model.eagle=Org/Gated is gated and this account has no access: accept its licence on "
                     "https://huggingface.co/Org/Gated, then log in with `hf auth login` (huggingface-cli login on "
                     "older huggingface_hub) or set HF_TOKEN to a token of that account")
    assert typo.startswith(f"model.eagle3=Org/Typo: no such model on {fake_hub} (or it is private")


def test_a_cells_checkpoints_are_named_by_their_config_keys(compose_cell) -> None:
    def keys(*overrides: str) -> list[tuple[str, str]]:
        return cell_from_config(compose_cell(list(overrides))).checkpoints()

    target = ("model.path", "embedded:smollm2-135m-instruct")
    assert keys("method=ngram") == [target]
    assert keys("method=draft_model") == [target, ("model.drafts.small", "embedded:smollm2-135m-instruct-l24")]
    assert keys("method=eagle3", "model.eagle3=Org/Head") == [target, ("model.eagle3", "Org/Head")]
    assert keys("method=controlled") == [target]  # its speculative_config.model is a class, not a checkpoint


def test_the_sweep_refuses_a_missing_hub_checkpoint_and_pricing_does_not_look(hf_home, monkeypatch,
                                                                             compose_cell) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    jobs = [["method=draft_model", "model.drafts.small=Org/Draft"], ["method=ngram"]]
    planned = plan_cells(jobs, compose_cell)  # the plan command prices it without the checkpoint
    assert {p.cell.method for p in planned} == {"baseline", "draft_model", "ngram"}
    with pytest.raises(hub.HubError, match=r"^model.drafts.small=Org/Draft is not in the Hugging Face cache"):
        plan_cells(jobs, compose_cell, fetch=True)


def test_an_engine_records_the_hub_revisions_it_loads(hf_home, compose_cell) -> None:
    # The head's shapes are the embedded target's: where that target is prepared, the config check reads both.
    head_config = json.dumps({"hidden_size": 576, "vocab_size": 49152})
    snapshot = cache_checkpoint(hf_home, "Org/Head", {"config.json": head_config, "model.safetensors": "w"})
    cell = cell_from_config(compose_cell(["method=eagle3", "model.eagle3=Org/Head"]))
    spec = cell.engine_spec(prepare=False)
    assert spec.speculative_config["model"] == str(snapshot)
    assert job._revisions(spec) == {"model_revision": None, "drafter_revision": COMMIT}


# A checkpoint in the hub cache running a real cell with the network out of reach: tests/test_e2e.py's single run
# measures its target that way (a command of its own here would cost a vLLM import and an engine more).


def test_a_checkpoint_whose_tokenizer_vllm_loads_is_not_complete_without_it(hf_home, monkeypatch,
                                                                            compose_cell) -> None:
    """The 0.5B Qwen draft of the 7B has another vocabulary size: vLLM loads its own tokenizer (the V1
    proposer maps the two vocabularies). Cached without its tokenizer files, every worker would fail on it."""
    cell = cell_from_config(compose_cell(["model=qwen2.5-7b-instruct", "method=draft_model"]))
    target, draft = "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"
    assert cell.tokenizer_checkpoints() == [target, draft]
    weights = {"config.json": "{}", "model.safetensors": "w"}
    cache_checkpoint(hf_home, target, weights | {"tokenizer.json": "{}"})
    cache_checkpoint(hf_home, draft, weights)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hub.HubError) as refused:
        hub.fetch_all(cell.checkpoints(), cell.tokenizer_checkpoints())
    (line,) = str(refused.value).splitlines()
    assert line.startswith(f"model.drafts.small={draft} is in the Hugging Face cache") and "tokenizer files" in line
    # An EAGLE head, or a draft of the target's vocabulary, uses the target's tokenizer: weights suffice.
    head = cell_from_config(compose_cell(["model=qwen2.5-7b-instruct", "method=eagle3"]))
    assert head.tokenizer_checkpoints() == [target]
    same = cell_from_config(compose_cell(["model=llama-3.1-8b-instruct", "method=draft_model"]))
    assert same.tokenizer_checkpoints() == [same.identity["model"]["path"]]
    # The target's tokenizer is always loaded, also where a caller does not say.
    assert hub.cached_snapshot(draft) is not None and hub.cached_snapshot(draft, tokenizer=True) is None
    with pytest.raises(hub.HubError, match=r"^model.path=Qwen/Qwen2.5-0.5B-Instruct is in the Hugging Face cache"):
        hub.fetch_all([("model.path", draft)])
    for form in ({"tokenizer.model": "sp"}, {"vocab.json": "{}", "merges.txt": ""}):
        complete = cache_checkpoint(hf_home, f"Org/{len(form)}", weights | form)
        assert hub.cached_snapshot(f"Org/{len(form)}", tokenizer=True) == complete


PINNED = "fedcba9876543210fedcba9876543210fedcba98"


def test_a_pinned_revision_is_fetched_and_loaded_at_that_commit(hf_home, monkeypatch, compose_cell, capsys) -> None:
    """model.revisions pins a hub id's commit: the cache's main is not taken for it, the engine is handed that
    commit's snapshot folder (so its workers load exactly it), and the row records it."""
    files = {"config.json": "{}", "model.safetensors": "w", "tokenizer.json": "{}"}
    main = cache_checkpoint(hf_home, "Org/Small", files)
    pinned = main.parent / PINNED
    pinned.mkdir()
    for name in files:
        (pinned / name).symlink_to((main / name).resolve())
    no_network(monkeypatch)
    assert hub.fetch_all([("model.path", "Org/Small")], revisions={"Org/Small": PINNED}) == {"Org/Small": pinned}
    assert "warning" not in capsys.readouterr().err
    assert hub.fetch_all([("model.path", "Org/Small")], revisions={"Org/Small": None}) == {"Org/Small": main}
    assert ("warning: model.path=Org/Small has no pinned revision (model.revisions in its model config)"
            in capsys.readouterr().err)
    def pinned_to(revision: str) -> Any:
        cfg = compose_cell(["model.path=Org/Small"])
        cfg.model.revisions = {"Org/Small": revision}  # a model config's revisions, as its YAML sets them
        return cfg

    cell = cell_from_config(pinned_to(PINNED))
    assert cell.revisions() == {"Org/Small": PINNED}
    spec = cell.engine_spec(prepare=False)
    assert spec.model == str(pinned) and job._revisions(spec)["model_revision"] == PINNED
    # A pin the cache does not hold is not replaced by main: offline, it is refused with the command that fetches it.
    other = "0" * 40
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hub.HubError) as refused:
        hub.fetch_all([("model.path", "Org/Small")], revisions={"Org/Small": other})
    assert f"at its pinned revision {other}" in str(refused.value)
    assert f"hf download Org/Small --revision {other}" in str(refused.value)
    bad = config.validate(pinned_to("main"))
    assert any(e.startswith("model.revisions.Org/Small='main' must be a commit") for e in bad), bad


def test_a_pinned_checkpoint_is_downloaded_at_its_commit(fake_hub, hf_home, monkeypatch) -> None:
    calls: list[dict[str, Any]] = []

    def download(repo_id: str, **kwargs: Any) -> str:  # the transfer: no hub to download from here
        calls.append(kwargs)
        folder = hf_home / "hub" / "models--Org--Open" / "snapshots" / kwargs["revision"]
        folder.mkdir(parents=True)
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            (folder / name).write_text("{}")
        return str(folder)

    monkeypatch.setattr("huggingface_hub.snapshot_download", download)
    found = hub.fetch_all([("model.path", "Org/Open")], revisions={"Org/Open": PINNED})
    assert found == {"Org/Open": hf_home / "hub" / "models--Org--Open" / "snapshots" / PINNED}
    assert [c["revision"] for c in calls] == [PINNED]
