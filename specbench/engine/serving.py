"""Serving cells inside the engine worker: vLLM's async engine (``AsyncLLM``), in process, no HTTP.

:class:`ServingEngine` is what an engine worker builds for a serving cell
(:attr:`specbench.engine.EngineSpec.serving`). :meth:`ServingEngine.serve`
sends a :class:`specbench.load.ServingPlan`'s requests on its arrival
schedule, one coroutine per request, each streaming its output in deltas, as
``vllm bench serve`` does over HTTP; the scheduler batches them exactly as
behind ``vllm serve``. A :class:`StepRecorder` (a ``StatLoggerBase``) records
the scheduler's state at every engine step: the running batch over time. The engine starts in ``vllm serve``'s usage context
(:data:`specbench.load.USAGE_CONTEXT`), so every engine key specbench leaves unset takes the
server's default for the device, not the offline engine's. Like
:mod:`specbench.engine.worker`, this module imports vLLM only inside its
functions.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from specbench.engine import EngineSpec
from specbench.engine.mode import engine_mode
from specbench.load import USAGE_CONTEXT, EngineStep, ServedRequest, ServingMeasurement, ServingPlan, replay
from specbench.sampling import GREEDY

# Tries, and the wait between them, at resetting the prefix cache before a cell (:meth:`ServingEngine.serve`).
RESET_TRIES, RESET_WAIT_S = 40, 0.05


def _steps_recorder(sink: list[EngineStep], clock: list[float]) -> Any:
    """A stat-logger factory for AsyncLLM whose loggers append each step's scheduler state to ``sink``.

    ``clock[0]`` is the schedule's start (``time.perf_counter``); each step is
    stamped when its outputs reach this process. vLLM calls ``SchedulerStats``
    an unstable interface: every field is read with a default, so a renamed one
    leaves a zero, not a crash.
    """
    from vllm.v1.metrics.loggers import StatLoggerBase

    class StepRecorder(StatLoggerBase):
        """Records the running batch and drafted tokens of every engine step."""

        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            if scheduler_stats is None:
                return
            spec = getattr(scheduler_stats, "spec_decoding_stats", None)
            sink.append(EngineStep(
                at_s=time.perf_counter() - clock[0],
                running=int(getattr(scheduler_stats, "num_running_reqs", 0) or 0),
                waiting=int(getattr(scheduler_stats, "num_waiting_reqs", 0) or 0),
                draft_tokens=int(getattr(spec, "num_draft_tokens", 0) or 0),
                drafted_per_pos=tuple(int(v) for v in (getattr(spec, "num_draft_tokens_per_pos", None) or ())),
            ))

        def log_engine_initialized(self) -> None:
            pass

    return StepRecorder


class ServingEngine:
    """vLLM's ``AsyncLLM`` for one :class:`EngineSpec`, driven from this worker's own event loop."""

    def __init__(self, spec: EngineSpec) -> None:
        from vllm import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        self._steps: list[EngineStep] = []
        self._clock = [time.perf_counter()]
        self._loop = asyncio.new_event_loop()
        arguments = AsyncEngineArgs(**spec.llm_kwargs())

        async def start() -> Any:
            return AsyncLLM.from_engine_args(arguments, usage_context=UsageContext[USAGE_CONTEXT],
                                             stat_loggers=[_steps_recorder(self._steps, self._clock)])

        self.engine = self._loop.run_until_complete(start())
        # The front end's copy of the config, resolved before the engine core started (its own process).
        self.mode = engine_mode(self.engine.vllm_config)
        # specbench.engine.fixes repairs sampled decoding only, and serving cells decode greedily
        # (specbench.load.validate); its patches would not reach the engine core's own process anyway.
        self.vllm_fixes: tuple[str, ...] = ()

    def serve(self, plan: ServingPlan) -> ServingMeasurement:
        """Send ``plan``'s requests on its schedule; every request's chunks and every engine step."""
        return self._loop.run_until_complete(self._serve(plan))

    async def _serve(self, plan: ServingPlan) -> ServingMeasurement:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        # One SamplingParams per output length (load.output_len draws one per request; else all max_tokens).
        lengths = {plan.max_tokens_of(i) for i in range(len(plan.prompts))}
        params = {n: SamplingParams(max_tokens=n, output_kind=RequestOutputKind.DELTA, ignore_eos=plan.ignore_eos,
                                    **GREEDY.params()) for n in lengths}
        tag = uuid.uuid4().hex[:8]
        # Every cell (and every capacity probe) meets a cold prefix cache: one cell's prompts cached by
        # the cell before it would give it prefills the next cell's baseline pays for; its warm-up then
        # warms the cache on purpose. vLLM refuses the reset while any block is held, so a block the last
        # cell's final step has not yet released is waited for, briefly.
        for _ in range(RESET_TRIES):
            if await self.engine.reset_prefix_cache():
                break
            await asyncio.sleep(RESET_WAIT_S)
        else:
            raise RuntimeError(f"vLLM refused to reset the prefix cache before a serving cell "
                               f"{RESET_TRIES} times: blocks still held with no request in flight")
        self._steps.clear()
        start = self._clock[0] = time.perf_counter()
        served, due = await replay(plan.arrivals_s, plan.max_concurrency, start,
                                   lambda i: self._request(i, plan, params[plan.max_tokens_of(i)], tag, start),
                                   plan.warmup_requests)
        return ServingMeasurement(requests=tuple(served), steps=tuple(self._steps),
                                  warmup_requests=plan.warmup_requests, arrivals_s=due)

    async def _request(self, index: int, plan: ServingPlan, params: Any, tag: str, start: float) -> ServedRequest:
        sent = time.perf_counter() - start
        chunks: list[float] = []
        counts: list[int] = []
        tokens: list[int] = []
        last: Any = None
        async for output in self.engine.generate({"prompt_token_ids": list(plan.prompts[index])}, params,
                                                 request_id=f"{tag}-{index}"):
            new = output.outputs[0].token_ids
            if new:
                chunks.append(time.perf_counter() - start)
                counts.append(len(new))
                tokens.extend(new)
            last = output
        stats = getattr(last, "metrics", None)
        queued, scheduled = getattr(stats, "queued_ts", 0.0), getattr(stats, "scheduled_ts", 0.0)
        spec = getattr(last.outputs[0], "spec_decode_metrics", None) if last is not None else None
        histogram = tuple(int(n) for n in getattr(spec, "histogram", None) or ())
        steps = getattr(spec, "per_step_accepted", None)
        drafted = getattr(spec, "per_step_drafted", None) or ()
        return ServedRequest(
            sent_s=sent,
            chunk_s=tuple(chunks),
            chunk_tokens=tuple(counts),
            queue_s=scheduled - queued if queued > 0 and scheduled >= queued else None,
            token_ids=tuple(tokens),
            drafts=sum(histogram) if spec is not None else None,
            accepted_tokens=sum(j * n for j, n in enumerate(histogram)) if spec is not None else None,
            accepted_histogram=histogram,
            last_accepted=int(steps[-1]) if steps else None,
            draft_tokens=int(getattr(spec, "num_draft_tokens", 0) or 0) if spec is not None else None,
            drafted_per_step=tuple(int(n) for n in drafted),
        )

    def shutdown(self) -> None:
        """Stop the engine core process (an engine left open keeps its process and its share of the machine)."""
        self.engine.shutdown()
        self._loop.close()
