"""Serving cells through the real server (``load.via=server``): the key, the stream, the counts, the engine.

The engine test, in tests/test_serving_engine.py (it shares the serving sweep's engine there), serves one tiny
greedy cell both ways and holds the server's token ids and each request's acceptance to the in-process engine's.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from typing import Any

import pytest

from specbench.config import ConfigError, cell_from_config, validate
from specbench.engine import EngineSpec, start_environment
from specbench.engine.server import ServerError, SseStream, StreamedCompletion, metrics_state
from specbench.load import ServedRequest, ServingMeasurement, ServingPlan
from specbench.measure import SpecCounters
from specbench.results import serving
from specbench.results.provenance import _descendants

SERVING = ["load.request_rate=2"]


def test_an_unknown_via_is_refused_in_one_line_naming_the_key_and_the_values(compose_cell):
    errors = validate(compose_cell([*SERVING, "load.via=http"]))
    assert errors == [e for e in errors if e.startswith("load.via='http' must be one of inprocess, server")]
    assert len(errors) == 1
    with pytest.raises(ConfigError, match="load.via"):
        cell_from_config(compose_cell([*SERVING, "load.via=http"]))


def test_the_server_is_refused_on_an_offline_cell(compose_cell):
    errors = validate(compose_cell(["load.via=server"]))
    assert len(errors) == 1 and "load.via=server needs a serving cell" in errors[0]


def test_only_the_server_joins_the_identity_and_the_id(compose_cell):
    # An in-process cell keeps the id it had before load.via existed; the server's says so.
    default = cell_from_config(compose_cell(SERVING))
    inprocess = cell_from_config(compose_cell([*SERVING, "load.via=inprocess"]))
    server = cell_from_config(compose_cell([*SERVING, "load.via=server"]))
    assert inprocess.cell_id == default.cell_id and "via" not in default.identity["load"]
    assert server.cell_id.startswith("ngram-k4-b1-summarize-rate2-server-")
    assert server.config_hash != default.config_hash
    assert server.engine_spec(prepare=False).via_server and not default.engine_spec(prepare=False).via_server
    # Its baseline goes through the server too.
    assert server.baseline().cell_id.startswith("baseline-k0-b1-summarize-rate2-server-")
    assert server.baseline().engine_spec(prepare=False).via_server


def test_events_are_parsed_across_chunk_boundaries():
    stream = SseStream()
    first = b'data: {"choices": [{"token_ids": [1, 2]}]}\n\ndata: {"choi'
    assert stream.feed(first) == [{"choices": [{"token_ids": [1, 2]}]}]
    assert stream.feed(b'ces": []}\n\n') == [{"choices": []}]
    assert stream.feed(b"data: [DONE]\n\n") == [] and stream.done


def test_ttft_and_chunks_count_only_chunks_with_tokens_and_usage_checks_them():
    completion = StreamedCompletion()
    completion.add({"choices": [{"text": "", "token_ids": []}]}, 0.1)  # nothing generated yet: no chunk
    completion.add({"choices": [{"text": "a", "token_ids": [5]}]}, 0.5)
    completion.add({"choices": [{"text": "bc", "token_ids": [6, 7, 8]}]}, 0.6)  # a speculative step: 3 tokens
    completion.add({"choices": [], "usage": {"completion_tokens": 4}}, 0.7)
    completion.checked(0)
    assert completion.chunk_s == [0.5, 0.6] and completion.chunk_tokens == [1, 3]
    assert completion.token_ids == [5, 6, 7, 8]
    short = StreamedCompletion()
    short.add({"choices": [{"token_ids": [5]}], "usage": {"completion_tokens": 2}}, 0.5)
    with pytest.raises(ServerError, match="1 token ids streamed but the server's usage counts 2"):
        short.checked(3)
    with pytest.raises(ServerError, match="without usage"):
        StreamedCompletion().checked(0)


def test_each_request_carries_its_own_acceptance_from_the_final_usage_chunk():
    # vLLM 0.32 started with --per-request-spec-decode-metrics puts the request's own counts in its final
    # usage chunk (metrics.speculative_decoding). At 913428f they were dropped and acceptance came from
    # /metrics differenced over a window that held other requests' steps.
    completion = StreamedCompletion()
    completion.add({"choices": [{"token_ids": [5, 6, 7]}]}, 0.5)
    completion.add({"choices": [{"token_ids": [8]}]}, 0.6)
    completion.add({"choices": [], "usage": {"completion_tokens": 4}, "metrics": {"speculative_decoding": {
        "mean_acceptance_length": 2.0, "draft_acceptance_rate": 0.25, "acceptance_histogram": [1, 0, 1, 0],
        "num_spec_steps": 2, "num_accepted_draft_tokens": 2, "num_draft_tokens": 6, "num_spec_tokens": 3,
        "per_step_accepted": [2, 0], "per_step_drafted": [3, 3]}}}, 0.7)
    completion.checked(0)
    counts = completion.spec_counts()
    assert counts == {"drafts": 2, "accepted_tokens": 2, "accepted_histogram": (1, 0, 1, 0), "last_accepted": 0,
                      "draft_tokens": 6, "drafted_per_step": (3, 3)}
    served = ServedRequest(0.0, tuple(completion.chunk_s), tuple(completion.chunk_tokens), None,
                           tuple(completion.token_ids), **counts)
    plan = ServingPlan(((1,), (1,)), (0.0, 0.0), 4, None, 1)
    measured = serving.as_measurement(ServingMeasurement((served, served), (), 1, (0.0, 0.0)), plan)
    assert measured.counters.drafts == 2 and measured.counters.accepted_tokens == 2
    assert measured.counters.draft_tokens == 6
    assert StreamedCompletion().spec_counts() == {}  # no speculation: the request has no counts


def test_the_running_batch_and_the_speculative_counters_are_read_from_metrics():
    text = "\n".join([
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
        'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0',
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0',
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 25.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 9.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 16.0',
    ])
    running, waiting, counters = metrics_state(text)
    assert (running, waiting) == (3, 1)
    assert counters == SpecCounters(drafts=10, draft_tokens=40, accepted_tokens=25, accepted_per_pos=(16, 9))


def test_acceptance_through_the_server_is_the_window_counters():
    plan = ServingPlan(prompts=((1, 2), (1, 2), (1, 2)), arrivals_s=(0.0, 0.5, 1.0), max_tokens=4,
                       max_concurrency=None, warmup_requests=1)
    requests = tuple(ServedRequest(t, (t + 0.2, t + 0.3), (1, 3), None, (7, 8, 9, 10)) for t in plan.arrivals_s)
    window = SpecCounters(drafts=4, draft_tokens=16, accepted_tokens=6, accepted_per_pos=(4, 2))
    served = ServingMeasurement(requests=requests, steps=(), warmup_requests=1, arrivals_s=plan.arrivals_s,
                                counters=window)
    assert serving.as_measurement(served, plan).counters == window
    assert serving.cell_columns(served, {"request_rate": 2, "burstiness": 1, "via": "server"}, plan)["load_via"] \
        == "server"
    assert serving.cell_columns(served, {"request_rate": 2, "burstiness": 1}, plan)["load_via"] == "inprocess"


class FakeServer:
    """A stand-in for ``vllm serve`` on a local port: /reset_prefix_cache, /metrics and streaming
    /v1/completions, each request's speculative counts added to the server's counters as it completes.

    The reset refuses once (a block still held) before it succeeds; a warm-up request (prompt ``(0,)``)
    drafts 100 times, so that a window holding the warm-up would read a far lower acceptance."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.drafts = self.draft_tokens = self.accepted = 0
        self.refusals = 1

    def app(self) -> Any:
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/reset_prefix_cache", self.reset)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.complete)
        return app

    async def reset(self, request: Any) -> Any:
        from aiohttp import web

        self.calls.append("reset")
        self.refusals -= 1
        return web.json_response({"success": self.refusals < 0})

    async def metrics(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(text="\n".join([
            'vllm:num_requests_running{engine="0"} 0.0', 'vllm:num_requests_waiting{engine="0"} 0.0',
            f'vllm:spec_decode_num_drafts_total{{engine="0"}} {self.drafts}.0',
            f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {self.draft_tokens}.0',
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {self.accepted}.0']))

    async def complete(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.json()
        self.calls.append(f"complete {body['prompt']}")
        warm = body["prompt"] == [0]
        histogram = [100, 0, 0] if warm else [1, 1, 2]  # steps that accepted 0, 1, 2 drafts
        reply = web.StreamResponse()
        await reply.prepare(request)
        await asyncio.sleep(0.05)  # the prefill: nothing drafts before it
        await reply.write(b'data: {"choices": [{"token_ids": [5, 6, 7]}]}\n\n')
        self.drafts += sum(histogram)
        self.draft_tokens += 2 * sum(histogram)
        self.accepted += sum(j * n for j, n in enumerate(histogram))
        final = {"choices": [], "usage": {"completion_tokens": 3}, "metrics": {
            "queue_time_ms": 250.0 if warm else 40.0 + body["prompt"][0],
            "speculative_decoding": {"acceptance_histogram": histogram, "num_draft_tokens": 2 * sum(histogram),
                                     "per_step_accepted": [0], "per_step_drafted": [2]}}}
        await reply.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
        return reply


def test_through_the_server_the_cache_is_reset_and_metrics_cross_check_the_measured_requests_alone():
    # Before: the server's prefix cache was never reset, queue_s was null through the server, and /metrics
    # was read only where a request lacked its own counts, so nothing cross-checked the usage chunks.
    from aiohttp import web

    from specbench.engine.server import ServerEngine

    fake, loop = FakeServer(), asyncio.new_event_loop()
    runner = web.AppRunner(fake.app())
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    engine = object.__new__(ServerEngine)  # the client alone: no vllm serve to start
    engine.speculative, engine.model, engine._loop = True, "m", loop
    engine.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    plan = ServingPlan(prompts=((0,), (1,), (2,)), arrivals_s=(0.0, 0.05, 0.1), max_tokens=3,
                       max_concurrency=None, warmup_requests=1)
    try:
        served = engine.serve(plan)
    finally:
        loop.run_until_complete(runner.cleanup())
        loop.close()
    assert fake.calls[:2] == ["reset", "reset"] and fake.calls[2] == "complete [0]"  # retried, before the warm-up
    # The window holds the two measured requests (4 drafts, 5 accepted each), not the warm-up's 100 drafts.
    assert served.server_counters == SpecCounters(drafts=8, draft_tokens=16, accepted_tokens=10)
    assert served.counters is None  # every measured request carried its own counts: acceptance is theirs
    assert [r.queue_s for r in served.requests] == [0.25, 0.041, 0.042]
    columns = serving.cell_columns(served, {"request_rate": 2, "burstiness": 1, "via": "server"}, plan)
    assert columns["server_metrics_acceptance"] == pytest.approx(1 + 10 / 8)
    assert columns["server_metrics_note"] is None
    assert columns["queue_s_p50"] == pytest.approx(0.0415)
    assert serving.as_measurement(served, plan).counters.drafts == 8


def test_acceptance_from_metrics_that_disagrees_with_the_usage_chunks_is_noted():
    plan = ServingPlan(prompts=((1,), (2,), (3,)), arrivals_s=(0.0, 0.5, 1.0), max_tokens=4,
                       max_concurrency=None, warmup_requests=1)
    requests = tuple(ServedRequest(t, (t + 0.2, t + 0.3), (1, 3), None, (7, 8, 9, 10), drafts=2, accepted_tokens=2,
                                   accepted_histogram=(1, 0, 1)) for t in plan.arrivals_s)
    load = {"request_rate": 2, "burstiness": 1, "via": "server"}

    def columns(window: SpecCounters | None) -> dict[str, Any]:
        return serving.cell_columns(ServingMeasurement(requests, (), 1, plan.arrivals_s, server_counters=window),
                                    load, plan)

    agrees = columns(SpecCounters(drafts=4, draft_tokens=8, accepted_tokens=4))
    assert agrees["server_metrics_acceptance"] == 2.0 and agrees["server_metrics_note"] is None
    # The warm-up's steps inside the window: 6 drafts, 4 accepted reads 1.67 against the requests' 2.00.
    off = columns(SpecCounters(drafts=6, draft_tokens=12, accepted_tokens=4))
    assert off["server_metrics_acceptance"] == pytest.approx(5 / 3)
    assert off["server_metrics_note"] == ("the server's /metrics over the measured requests read acceptance 1.667 "
                                          "(4 accepted in 6 drafts), their own usage chunks 2.000 (4 in 4)")
    inprocess = serving.cell_columns(ServingMeasurement(requests, (), 1, plan.arrivals_s), {**load, "via": "inprocess"},
                                     plan)
    assert inprocess["server_metrics_acceptance"] is None and inprocess["server_metrics_note"] is None


def test_the_server_starts_in_development_mode_with_per_request_metrics(compose_cell, monkeypatch, tmp_path):
    # vLLM 0.32 mounts POST /reset_prefix_cache only with VLLM_SERVER_DEV_MODE=1, and puts queue_time_ms in
    # the final usage chunk only under --enable-per-request-metrics.
    from specbench.engine import server

    started: dict[str, Any] = {}

    class Started(Exception):
        pass

    real = server.subprocess.Popen

    def popen(command: list[str], **kwargs: Any) -> Any:
        if "vllm.entrypoints.openai.api_server" not in command:
            return real(command, **kwargs)  # vLLM's own probes while it loads
        started.update(command=command, env=kwargs["env"])
        raise Started

    monkeypatch.setattr(server.subprocess, "Popen", popen)
    monkeypatch.setattr(server.tempfile, "mkstemp", lambda **_: (0, str(tmp_path / "serve.log")))
    cell = cell_from_config(compose_cell([*SERVING, "load.via=server"]))
    with pytest.raises(Started):
        server.ServerEngine(cell.engine_spec(prepare=False))
    assert started["env"]["VLLM_SERVER_DEV_MODE"] == "1"
    assert "--enable-per-request-metrics" in started["command"]
    assert "--disable-log-stats" not in started["command"]  # vLLM refuses per-request metrics without stats


def test_cpu_accounting_reaches_grandchildren():
    # A server's engine core is the worker's grandchild: its CPU time is the cell's own, not another process's.
    shell = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    try:
        deadline = time.monotonic() + 10
        while len(found := _descendants(os.getpid())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert shell.pid in found and len(found) >= 2
    finally:
        for pid in _descendants(shell.pid):
            os.kill(pid, signal.SIGKILL)
        shell.kill()
        shell.wait()


def test_the_engine_test_of_the_server_forks_its_workers_from_the_sessions_server(compose_cell):
    # The engine workers of the pytest process fork from one server (engine.worker_context), which the engine tests
    # before test_serving_engine's server test start with EngineSpec's defaults; a worker whose start environment
    # differs is spawned and imports vLLM again.
    from test_serving_engine import GREEDY_SERVED

    default = EngineSpec(model="m", dtype="float32", seed=0, max_model_len=64, max_num_seqs=1, enforce_eager=True,
                         enable_prefix_caching=False, gpu_memory_utilization=0.9, cpu_kvcache_space_gib=1)
    for via in ("inprocess", "server"):
        spec = cell_from_config(compose_cell([*GREEDY_SERVED, f"load.via={via}"])).engine_spec(prepare=False)
        assert start_environment(spec.preload, spec.cpu_huge_pages) == start_environment(
            default.preload, default.cpu_huge_pages), via


def test_the_server_gets_the_engine_arguments_the_in_process_engine_gets(compose_cell):
    # Parsed back by vllm serve's own parser: every keyword argument of the in-process engine arrives as given.
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from specbench.engine.server import server_arguments

    cell = cell_from_config(compose_cell([*SERVING, "load.via=server", "engine.max_num_batched_tokens=1024",
                                          "engine.enable_prefix_caching=false"]))
    spec = cell.engine_spec(prepare=False)
    parsed = AsyncEngineArgs.from_cli_args(make_arg_parser(FlexibleArgumentParser()).parse_args(server_arguments(spec)))
    for name, value in spec.llm_kwargs().items():
        assert getattr(parsed, name) == value, name
