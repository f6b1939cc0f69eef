"""Serving cells through the real server: ``vllm serve`` in a process of its own, driven over HTTP.

:class:`ServerEngine` is what an engine worker builds for a serving cell with
``load.via=server`` (:attr:`specbench.engine.EngineSpec.via_server`). It starts
vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``, this
interpreter) with the engine arguments the in-process :class:`ServingEngine`
gets (:func:`server_arguments`), on a free local port, and waits for its
``/health``. :meth:`ServerEngine.serve` then sends a
:class:`specbench.load.ServingPlan`'s requests on the same arrival schedule,
from the worker's own process, as ``vllm bench serve`` sends them
(``vllm/benchmarks/lib/endpoint_request_func.py``): one streaming
``/v1/completions`` request each, the prompt as token ids, greedy, with
``stream_options.include_usage``. TTFT is the first chunk that carries a token,
ITL the gaps between such chunks, and the output length the server's
``usage.completion_tokens``, checked against the token ids streamed.

Each request's own speculative counts and its queueing delay come in its final
usage chunk (``metrics.speculative_decoding`` under
``--per-request-spec-decode-metrics``, ``metrics.queue_time_ms`` under
``--enable-per-request-metrics``; vLLM 0.32). What the HTTP path cannot read
per request is read from the server's ``/metrics``: the running and waiting
requests every :data:`METRICS_PERIOD_S` (the running batch), and the
speculative counters differenced from the first measured send to the last
measured token, a cross-check of the requests' own counts (and their stand-in
where a measured request came without them). Before each cell's warm-up the
server's prefix cache is reset (``POST /reset_prefix_cache``), as the
in-process engine's is. The server, its engine core and the server's log go
with :meth:`ServerEngine.shutdown`.

The client uses ``aiohttp``, which vLLM itself depends on. This module
imports vLLM only inside :func:`server_arguments`; the stream parsing and the
count check are plain Python.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from specbench.engine import EngineError, EngineSpec
from specbench.load import EngineStep, ServedRequest, ServingMeasurement, ServingPlan, replay
from specbench.measure import SpecCounters
from specbench.sampling import GREEDY

# How often the running batch is read from /metrics (vllm bench serve reads none; the in-process
# path reads every engine step).
METRICS_PERIOD_S = 0.25
# Seconds a server has to answer /health: loading the model, and on a GPU compiling and capturing graphs.
START_TIMEOUT_S = 900.0
# Seconds between SIGTERM and SIGKILL to the server's process group.
STOP_GRACE_S = 20.0
# Characters of the server's log an error carries.
LOG_TAIL_CHARS = 4000
# Tries, and the wait between them, at resetting the server's prefix cache before a cell: vLLM answers
# success false while a block is still held (the last cell's final step not yet released).
RESET_TRIES, RESET_WAIT_S = 40, 0.05


class ServerError(EngineError):
    """The server failed to start, stopped, or answered a request wrongly."""


def server_arguments(spec: EngineSpec) -> list[str]:
    """``vllm serve``'s command-line arguments for ``spec``: the keyword arguments the in-process engine
    gets (:meth:`EngineSpec.llm_kwargs`), each as its flag.

    Dicts (the speculative and compilation configs) go as JSON; ``True`` as the flag, ``False`` as its
    ``--no-`` form unless it is EngineArgs' default (``--disable-log-stats`` has no ``--no-`` form).
    """
    from vllm.engine.arg_utils import EngineArgs

    defaults = {f.name: f.default for f in dataclasses.fields(EngineArgs)}
    arguments: list[str] = []
    for name, value in spec.llm_kwargs().items():
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            if value:
                arguments.append(flag)
            elif defaults.get(name) is not False:
                arguments.append("--no-" + name.replace("_", "-"))
        elif isinstance(value, (dict, list)):
            arguments += [flag, json.dumps(value, sort_keys=True)]
        else:
            arguments += [flag, str(value)]
    return arguments


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SseStream:
    """Server-sent events from byte chunks as they arrive: each ``data:`` payload, parsed as JSON.

    An event ends at a blank line; a chunk may end inside one, or hold several. ``[DONE]`` ends the
    stream and yields nothing.
    """

    def __init__(self) -> None:
        self._buffer = ""
        self.done = False

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        """The events completed by ``chunk``, in order."""
        self._buffer += chunk.decode("utf-8")
        events: list[dict[str, Any]] = []
        while "\n\n" in self._buffer:
            event, self._buffer = self._buffer.split("\n\n", 1)
            for line in event.splitlines():
                if not line.startswith("data:"):
                    continue  # comments and other fields: vLLM sends none
                payload = line[len("data:"):].strip()
                if payload == "[DONE]":
                    self.done = True
                elif payload:
                    events.append(json.loads(payload))
        return events


@dataclasses.dataclass
class StreamedCompletion:
    """One completion as its chunks came: when each chunk with tokens came, its token ids, and the usage."""

    chunk_s: list[float] = dataclasses.field(default_factory=list)
    chunk_tokens: list[int] = dataclasses.field(default_factory=list)
    token_ids: list[int] = dataclasses.field(default_factory=list)
    completion_tokens: int | None = None
    # The request's own speculative counts, from the final usage chunk's metrics.speculative_decoding
    # (vLLM 0.32 with --per-request-spec-decode-metrics; None without speculation or on an older server).
    speculative: Mapping[str, Any] | None = None
    # The engine's queueing delay, queued to first scheduled, from the final usage chunk's
    # metrics.queue_time_ms (vLLM 0.32 with --enable-per-request-metrics: the in-process path's
    # scheduled_ts - queued_ts, computed in the server); None where the server sent none.
    queue_s: float | None = None

    def add(self, event: Mapping[str, Any], at_s: float) -> None:
        """Count one event received at ``at_s``: a chunk's token ids, or the final usage."""
        if event.get("error") or event.get("object") == "error":
            raise ServerError(f"the server sent an error in the stream: {event}")
        for choice in event.get("choices") or ():
            new = choice.get("token_ids") or []
            if new:
                self.chunk_s.append(at_s)
                self.chunk_tokens.append(len(new))
                self.token_ids.extend(int(t) for t in new)
        usage = event.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            self.completion_tokens = int(usage["completion_tokens"])
        metrics = event.get("metrics") or {}
        if metrics.get("speculative_decoding"):
            self.speculative = metrics["speculative_decoding"]
        if metrics.get("queue_time_ms") is not None:
            self.queue_s = float(metrics["queue_time_ms"]) / 1000.0

    def spec_counts(self) -> dict[str, Any]:
        """The request's own speculative counts as :class:`ServedRequest` holds them (as the in-process
        path reads them from ``RequestOutput``'s ``spec_decode_metrics``); {} where the server sent none."""
        if self.speculative is None:
            return {}
        histogram = tuple(int(n) for n in self.speculative.get("acceptance_histogram") or ())
        steps = self.speculative.get("per_step_accepted") or ()
        return {
            "drafts": sum(histogram),
            "accepted_tokens": sum(j * n for j, n in enumerate(histogram)),
            "accepted_histogram": histogram,
            "last_accepted": int(steps[-1]) if steps else None,
            "draft_tokens": int(self.speculative.get("num_draft_tokens") or 0),
            "drafted_per_step": tuple(int(n) for n in self.speculative.get("per_step_drafted") or ()),
        }

    def checked(self, index: int) -> None:
        """Raise unless the tokens streamed are the ones the server counted (``vllm bench serve``'s count)."""
        if self.completion_tokens is None:
            raise ServerError(f"request {index}: the stream ended without usage (completion_tokens)")
        if self.completion_tokens != len(self.token_ids):
            raise ServerError(f"request {index}: {len(self.token_ids)} token ids streamed but the server's "
                              f"usage counts {self.completion_tokens} completion tokens")


def prometheus_samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """Each sample of a Prometheus text exposition: name, labels, value."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        pairs = {}
        for item in labels.rstrip("}").split(","):
            if "=" in item:
                key, _, quoted = item.partition("=")
                pairs[key.strip()] = quoted.strip().strip('"')
        try:
            yield name.strip(), pairs, float(value)
        except ValueError:
            continue


def metrics_state(text: str) -> tuple[int, int, SpecCounters]:
    """Requests running and waiting, and the cumulative speculative counters, from ``/metrics``
    (summed over engines; Prometheus names counters with ``_total``)."""
    totals: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for name, labels, value in prometheus_samples(text):
        name = name.removesuffix("_total")
        if name == "vllm:spec_decode_num_accepted_tokens_per_pos" and "position" in labels:
            per_pos[int(labels["position"])] = per_pos.get(int(labels["position"]), 0.0) + value
        else:
            totals[name] = totals.get(name, 0.0) + value
    counters = SpecCounters(
        drafts=int(totals.get("vllm:spec_decode_num_drafts", 0)),
        draft_tokens=int(totals.get("vllm:spec_decode_num_draft_tokens", 0)),
        accepted_tokens=int(totals.get("vllm:spec_decode_num_accepted_tokens", 0)),
        accepted_per_pos=tuple(int(per_pos[p]) for p in sorted(per_pos)),
    )
    return (int(totals.get("vllm:num_requests_running", 0)), int(totals.get("vllm:num_requests_waiting", 0)),
            counters)


class ServerEngine:
    """``vllm serve`` for one :class:`EngineSpec` on a free local port, driven from this worker's event loop."""

    def __init__(self, spec: EngineSpec, start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.speculative = spec.speculative_config is not None
        self.model = spec.model
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(tempfile.mkstemp(prefix="specbench-vllm-serve-", suffix=".log")[1])
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *server_arguments(spec),
                   "--host", "127.0.0.1", "--port", str(self.port),
                   # A line per /metrics read (four a second) would bury the server's own log.
                   "--disable-uvicorn-access-log",
                   # Each request's queueing delay in its final usage chunk (metrics.queue_time_ms).
                   "--enable-per-request-metrics"]
        with open(self.log_path, "ab") as log:
            # The worker has applied worker_environment to os.environ (VLLM_CPU_KVCACHE_SPACE, threads, the
            # method's own settings): the server inherits it. VLLM_SERVER_DEV_MODE=1 because vLLM 0.32
            # mounts POST /reset_prefix_cache only in its development mode
            # (entrypoints/launchers/api_server/routers.py), as vLLM's own sweeps start their servers
            # (benchmarks/sweep/server.py); its other development routes stay on 127.0.0.1 with the rest.
            # A session of its own, so that stopping it reaches its engine core too.
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            env=dict(os.environ, VLLM_SERVER_DEV_MODE="1"), start_new_session=True)
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._wait_healthy(start_timeout_s))
        except BaseException:
            self.shutdown()
            raise
        # vLLM resolves its execution mode inside the server, which this process cannot read.
        self.mode = None
        # Greedy decoding only (specbench.load.validate): specbench.engine.fixes has nothing to repair.
        self.vllm_fixes: tuple[str, ...] = ()

    def log_tail(self) -> str:
        """The end of the server's log."""
        try:
            return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        except OSError:
            return "(no log)"

    async def _wait_healthy(self, timeout_s: float) -> None:
        import aiohttp

        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as session:
            while True:
                if self.process.poll() is not None:
                    raise ServerError(f"vllm serve exited with code {self.process.returncode} while starting; "
                                      f"its log ends:\n{self.log_tail()}")
                try:
                    async with session.get(f"{self.url}/health", timeout=aiohttp.ClientTimeout(total=5)) as reply:
                        if reply.status == 200:
                            return
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    raise ServerError(f"vllm serve did not answer /health within {timeout_s:.0f} s; "
                                      f"its log ends:\n{self.log_tail()}")
                await asyncio.sleep(0.5)

    def serve(self, plan: ServingPlan) -> ServingMeasurement:
        """Send ``plan``'s requests on its schedule over HTTP; every request's chunks and the /metrics samples."""
        return self._loop.run_until_complete(self._serve(plan))

    async def _serve(self, plan: ServingPlan) -> ServingMeasurement:
        import aiohttp

        # As vllm bench serve: no connection limit, a long total timeout (the cell's own timeout is the sweep's).
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=6 * 3600)) as session:
            await self._reset_prefix_cache(session)
            steps: list[EngineStep] = []
            before, _ = await self._metrics(session)
            start = time.perf_counter()
            window_start: list[asyncio.Task[Any]] = []
            sampling = asyncio.create_task(self._sample(session, steps, start))
            try:
                served, due = await replay(plan.arrivals_s, plan.max_concurrency, start,
                                           lambda index: self._request(session, index, plan, start, window_start),
                                           plan.warmup_requests)
            finally:
                sampling.cancel()
                await asyncio.gather(sampling, return_exceptions=True)
            after, _ = await self._metrics(session)
            # The server's counters over the measured requests alone: read as the first measured request
            # goes out (the warm-up burst has completed by then) and after the last measured token.
            window = after - (await window_start[0] if window_start else before) if self.speculative else None
            # Each request's own counts, from its final usage chunk, where every measured request carried
            # them (the in-process figure's definition); else the window stands in for them.
            missing = any(r.drafts is None for r in served[plan.warmup_requests:])
        return ServingMeasurement(requests=tuple(served), steps=tuple(steps), warmup_requests=plan.warmup_requests,
                                  arrivals_s=due, counters=window if missing else None, server_counters=window)

    async def _reset_prefix_cache(self, session: Any) -> None:
        """Empty the server's prefix cache, as :class:`specbench.engine.serving.ServingEngine` empties its
        own before each cell and capacity probe: no cell inherits the prompts the one before it cached."""
        for _ in range(RESET_TRIES):
            async with session.post(f"{self.url}/reset_prefix_cache") as reply:
                if reply.status != 200:
                    raise ServerError(f"POST /reset_prefix_cache: HTTP {reply.status}: {(await reply.text())[:500]}")
                if (await reply.json()).get("success"):
                    return
            await asyncio.sleep(RESET_WAIT_S)
        raise ServerError(f"vllm serve refused to reset its prefix cache before a serving cell {RESET_TRIES} "
                          "times: blocks still held with no request in flight")

    async def _metrics(self, session: Any) -> tuple[SpecCounters, tuple[int, int]]:
        """The speculative counters and the requests running and waiting, now."""
        async with session.get(f"{self.url}/metrics") as reply:
            running, waiting, counters = metrics_state(await reply.text())
        return counters, (running, waiting)

    async def _sample(self, session: Any, steps: list[EngineStep], start: float) -> None:
        """Read the running and waiting requests every :data:`METRICS_PERIOD_S` until cancelled."""
        while True:
            at = time.perf_counter() - start
            try:
                _, (running, waiting) = await self._metrics(session)
            except (OSError, asyncio.TimeoutError) as exc:
                raise ServerError(f"reading /metrics failed: {exc}; the server's log ends:\n{self.log_tail()}") from exc
            steps.append(EngineStep(at_s=at, running=running, waiting=waiting))
            await asyncio.sleep(max(0.0, start + at + METRICS_PERIOD_S - time.perf_counter()))

    async def _request(self, session: Any, index: int, plan: ServingPlan, start: float,
                       window_start: list[asyncio.Task[Any]]) -> ServedRequest:
        payload = {
            "model": self.model,
            "prompt": list(plan.prompts[index]),
            "max_tokens": plan.max_tokens_of(index),
            "ignore_eos": plan.ignore_eos,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
            **GREEDY.params(),
        }
        if index == plan.warmup_requests and self.speculative:
            # The counters as the first measured request goes out, read beside it rather than before it,
            # so that its send is not delayed by the read.
            window_start.append(asyncio.create_task(self._counters(session)))
        stream, completion = SseStream(), StreamedCompletion()
        sent = time.perf_counter() - start
        async with session.post(f"{self.url}/v1/completions", json=payload) as reply:
            if reply.status != 200:
                raise ServerError(f"request {index}: HTTP {reply.status}: {(await reply.text())[:500]}")
            async for chunk in reply.content.iter_any():
                at = time.perf_counter() - start
                for event in stream.feed(chunk):
                    completion.add(event, at)
        completion.checked(index)
        return ServedRequest(
            sent_s=sent, chunk_s=tuple(completion.chunk_s), chunk_tokens=tuple(completion.chunk_tokens),
            queue_s=completion.queue_s, token_ids=tuple(completion.token_ids), **completion.spec_counts(),
        )

    async def _counters(self, session: Any) -> SpecCounters:
        return (await self._metrics(session))[0]

    def kill(self) -> None:
        """Kill the server's process group now (the worker is about to exit without a shutdown)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def shutdown(self) -> None:
        """Stop the server and its engine core: SIGTERM to its process group, SIGKILL after
        :data:`STOP_GRACE_S`; its log then goes to this worker's output (the sweep's engine log)."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            except ProcessLookupError:
                pass
        self.kill()  # whatever of the group outlived its leader (a process it started and did not reap)
        if not self._loop.is_closed():
            self._loop.close()
        try:
            sys.stdout.write(self.log_path.read_text(errors="replace"))
            sys.stdout.flush()
            self.log_path.unlink()
        except OSError:
            pass
