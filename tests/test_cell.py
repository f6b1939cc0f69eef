"""The measurement core without vLLM: the protocol of measure.measure, counter arithmetic, the
request plan, engine reuse and the timeout path, against fakes that follow the real interfaces."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path
from typing import Sequence

import pytest

from specbench import engine, job
from specbench.measure import (
    WARMUP_MAX_TOKENS,
    CellPlan,
    GeneratedRequest,
    SpecCounters,
    TopTokens,
    measure,
    most_at_once,
)
from specbench.engine import EngineError, EnginePool, EngineSpec, EngineWorker
from specbench.sampling import GREEDY, Sampling


class FakeEngine:
    """A Generator whose outputs, timings and counters are scripted; it logs every call."""

    def __init__(self, *, unstable: bool = False) -> None:
        self.calls: list[tuple[str, int]] = []
        self.counters = SpecCounters()
        self.unstable = unstable
        self.generated = 0
        self.max_tokens: list[int] = []
        self.seeds: list[Sequence[int] | None] = []

    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: int, sampling: Sampling = GREEDY,
                 seeds: Sequence[int] | None = None) -> list[GeneratedRequest]:
        self.calls.append(("generate", len(prompts)))
        self.seeds.append(seeds)
        self.max_tokens.append(max_tokens)
        self.generated += 1
        # Each request drafts twice (2 tokens each) and has its first drafted token accepted once.
        c, n = self.counters, len(prompts)
        self.counters = SpecCounters(drafts=c.drafts + 2 * n, draft_tokens=c.draft_tokens + 4 * n,
                                     accepted_tokens=c.accepted_tokens + n,
                                     accepted_per_pos=(c.accepted_tokens + n,))
        tail = (self.generated,) if self.unstable else ()
        return [
            GeneratedRequest(tuple(p[:1]) + (7,) * (max_tokens - 1) + tail, ttft_s=0.1, e2e_s=0.5, tpot_s=0.01,
                             drafts=2, accepted_tokens=1)
            for p in prompts
        ]

    def spec_counters(self) -> SpecCounters:
        self.calls.append(("counters", 0))
        return self.counters

    def reference_pass(self, batches: Sequence[Sequence[Sequence[int]]], max_tokens: int) -> None:
        self.calls.append(("reference", len(batches)))


def plan(**changes) -> CellPlan:
    fields = dict(prompts=((1, 2), (3, 4), (5, 6), (7, 8)), batch_size=2, max_tokens=5, repetitions=3)
    return CellPlan(**(fields | changes))


def test_measure_warms_up_untimed_then_times_every_batch_of_every_repetition():
    fake = FakeEngine()
    m = measure(fake, plan())
    # Warm-up: the first batch, before the counters are read; then 3 repetitions x 2 batches.
    assert fake.calls[0] == ("generate", 2) and fake.calls[1] == ("counters", 0)
    assert [c for c in fake.calls[2:-1]] == [("generate", 2)] * 6 and fake.calls[-1] == ("counters", 0)
    assert len(m.rep_wall_s) == 3 and all(w > 0 for w in m.rep_wall_s)
    assert m.rep_output_tokens == [4 * 5] * 3
    assert m.prompt_tokens == 8 and len(m.token_ids) == 4 and m.outputs_stable
    # Counters cover the timed region only: 6 batches of 2 requests, not the warm-up's.
    assert (m.counters.drafts, m.counters.draft_tokens, m.counters.accepted_tokens) == (24, 48, 12)
    assert m.counters.accepted_per_pos == (12,)
    assert m.request_acceptance == [1.5] * 4  # per request of the first repetition: 1 + 1 accepted / 2 drafts
    assert m.request_decode_passes == [3] * 4  # 4 tokens after the first, 1 of them accepted
    # Per-request latencies of every timed request; decode time token-weighted.
    assert len(m.ttft_s) == len(m.tpot_s) == len(m.e2e_s) == 12
    assert m.decode_tokens == 12 * 4 and m.decode_s == pytest.approx(12 * 4 * 0.01)
    assert m.warmup_s is not None


def test_warm_up_decodes_few_tokens_and_the_timed_batches_all_of_them():
    fake = FakeEngine()
    measure(fake, plan(max_tokens=WARMUP_MAX_TOKENS + 24, repetitions=1))
    assert fake.max_tokens == [WARMUP_MAX_TOKENS] + [WARMUP_MAX_TOKENS + 24] * 2
    short = FakeEngine()
    measure(short, plan(max_tokens=3, repetitions=1))
    assert short.max_tokens == [3, 3, 3]


def test_measure_without_warm_up_runs_the_reference_pass_first_for_controlled_acceptance():
    fake = FakeEngine()
    m = measure(fake, plan(warmup=False, reference_pass=True, repetitions=1))
    assert fake.calls[0] == ("reference", 2) and fake.calls[1] == ("counters", 0)
    assert m.warmup_s is None and len(m.rep_wall_s) == 1


def test_outputs_that_change_between_repetitions_are_not_stable():
    m = measure(FakeEngine(unstable=True), plan())
    assert m.outputs_stable is False


def test_a_plan_must_split_into_full_batches():
    with pytest.raises(ValueError, match="full batches"):
        plan(batch_size=3)
    with pytest.raises(ValueError, match="repetitions"):
        plan(repetitions=0)
    assert plan().timed_batches == 6 and plan().batches()[1] == ((5, 6), (7, 8))


def test_spec_counters_difference_pads_per_position_lists():
    later = SpecCounters(drafts=10, draft_tokens=30, accepted_tokens=12, accepted_per_pos=(6, 4, 2),
                         drafted_per_pos=(10, 8, 6))
    earlier = SpecCounters(drafts=4, draft_tokens=10, accepted_tokens=5, accepted_per_pos=(3, 2),
                           drafted_per_pos=(4,))
    delta = later - earlier
    assert (delta.drafts, delta.draft_tokens, delta.accepted_tokens) == (6, 20, 7)
    assert delta.accepted_per_pos == (3, 2, 2) and delta.drafted_per_pos == (6, 8, 6)
    assert SpecCounters() - SpecCounters() == SpecCounters()


# --- job._plan ---------------------------------------------------------------------------------------


class _Workload:
    def __init__(self, token_ids):
        self.token_ids = token_ids


def test_plan_cycles_the_prompts_up_to_whole_batches(compose_cell):
    from specbench.config import cell_from_config

    cell = cell_from_config(compose_cell(["batch_size=4", "workload.max_tokens=9", "repetitions=2",
                                          "method=controlled", "method.alpha=0.5"]))
    made = job._plan(cell, _Workload(((1,), (2,), (3,), (4,), (5,))))
    assert made.prompts == ((1,), (2,), (3,), (4,), (5,), (1,), (2,), (3,))
    assert (made.batch_size, made.max_tokens, made.repetitions, made.reference_pass) == (4, 9, 2, True)


# --- EnginePool and the worker's timeout ----------------------------------------------------------------


class FakeWorker:
    """Stands in for EngineWorker: records starts and closes, no process."""

    started: list[FakeWorker] = []

    def __init__(self, spec: EngineSpec, log_path: object = None) -> None:
        self.spec, self.closed, self.alive = spec, False, True
        FakeWorker.started.append(self)

    def close(self) -> None:
        self.closed, self.alive = True, False


def spec(**changes) -> EngineSpec:
    fields = dict(model="m", dtype="float32", seed=0, max_model_len=256, max_num_seqs=8, enforce_eager=True,
                  enable_prefix_caching=False, gpu_memory_utilization=0.9, cpu_kvcache_space_gib=1)
    return EngineSpec(**(fields | changes))


def test_pool_reuses_the_engine_for_equal_specs_and_replaces_it_otherwise(monkeypatch):
    monkeypatch.setattr(engine, "EngineWorker", FakeWorker)
    FakeWorker.started = []
    pool = EnginePool()
    first = pool.get(spec())
    assert pool.get(spec()) is first and pool.engine_starts == 1
    other = pool.get(spec(instance=1))  # another pass: a fresh engine, the old one stopped
    assert other is not first and first.closed and pool.engine_starts == 2
    other.alive = False  # died between cells
    assert pool.get(spec(instance=1)) is not other and pool.engine_starts == 3
    pool.discard()
    assert FakeWorker.started[-1].closed


def _sleep_forever(conn) -> None:  # a worker that never answers (module level: spawn pickles it)
    time.sleep(600)


def test_a_cell_that_runs_past_its_timeout_fails_and_its_engine_is_killed():
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_sleep_forever, args=(child,), daemon=True)
    process.start()
    worker = EngineWorker.__new__(EngineWorker)  # the real parent side, around a hung process
    worker.spec, worker._conn, worker._process = spec(), parent, process
    start = time.monotonic()
    with pytest.raises(EngineError, match="timed out after 1 s while measuring the cell"):
        worker.measure(plan(), timeout_s=1.0)
    # Killed at once: a hung engine never reads the stop message it would otherwise be sent.
    assert time.monotonic() - start < 15
    assert not process.is_alive()


def test_run_cell_records_a_timed_out_cell_as_failed_and_discards_the_engine(tmp_path: Path, compose_cell,
                                                                             monkeypatch):
    from specbench.config import cell_from_config
    from specbench.results.schema import read_rows

    class HungWorker:
        pid = None
        info = None

        def measure(self, plan, timeout_s):
            raise EngineError(f"timed out after {timeout_s:.0f} s while measuring the cell")

    class Pool:
        discarded = 0

        def get(self, spec, log_path=None):
            return HungWorker()

        def discard(self):
            Pool.discarded += 1

    cell = cell_from_config(compose_cell(["method=baseline"]))
    monkeypatch.setattr(job, "_requests", lambda c: (_Workload(((1,),)), plan()))
    monkeypatch.setattr(job, "_local_machine", lambda: "CPU test")
    outcome = job.run_cell(cell, tmp_path, engine_runs=1, timeout_s=5, pool=Pool())  # type: ignore[arg-type]
    assert outcome.status == "failed" and "timed out after 5 s" in outcome.error
    assert Pool.discarded == 1
    row = read_rows(tmp_path / f"{cell.cell_id}.parquet")[0]
    assert row["status"] == "failed" and "timed out" in row["error"]


def test_a_workers_start_environment_preloads_the_allocator_first_and_keeps_what_the_user_preloaded(monkeypatch):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert engine.start_environment(None, False) == {}
    assert engine.start_environment(None, True) == {"THP_MEM_ALLOC_ENABLE": "1"}
    assert engine.start_environment("/v/libtcmalloc_minimal.so.4", False) == {
        "LD_PRELOAD": "/v/libtcmalloc_minimal.so.4"}
    monkeypatch.setenv("LD_PRELOAD", "/opt/libiomp5.so")
    assert engine.start_environment("/v/libtcmalloc_minimal.so.4", False) == {
        "LD_PRELOAD": "/v/libtcmalloc_minimal.so.4:/opt/libiomp5.so"}
    env = engine.worker_environment(spec(preload="/v/libtcmalloc_minimal.so.4", cpu_huge_pages=True))
    assert env["LD_PRELOAD"].startswith("/v/libtcmalloc_minimal.so.4") and env["THP_MEM_ALLOC_ENABLE"] == "1"


def test_a_worker_whose_start_environment_the_fork_server_lacks_is_spawned(monkeypatch):
    # Only a process's start applies LD_PRELOAD and torch's huge pages: a forked worker inherits the server's.
    monkeypatch.delenv("SPECBENCH_WORKER_START", raising=False)
    monkeypatch.setattr(engine, "_SERVER_STARTED", True)
    monkeypatch.setattr(engine, "_SERVER_START_ENV", {"THP_MEM_ALLOC_ENABLE": "1"})
    assert engine.worker_context(None, {"THP_MEM_ALLOC_ENABLE": "1"}).get_start_method() == "forkserver"
    assert engine.worker_context(None, {}).get_start_method() == "spawn"


def test_the_worker_names_the_malloc_it_runs_with_from_its_memory_map(tmp_path: Path):
    from specbench.engine.worker import loaded_allocator

    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert loaded_allocator(str(maps)) == "glibc"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /work/.venv/lib/libtcmalloc_minimal.so.4\n")
    assert loaded_allocator(str(maps)) == "tcmalloc"
    assert loaded_allocator(str(tmp_path / "missing")) is None


def test_the_worker_reads_its_huge_pages_from_the_kernel(tmp_path: Path):
    from specbench.engine.worker import huge_page_bytes

    rollup = tmp_path / "smaps_rollup"
    rollup.write_text("Rss:             1048576 kB\nAnonHugePages:    614400 kB\n")
    assert huge_page_bytes(str(rollup)) == 614400 * 1024
    assert huge_page_bytes(str(tmp_path / "missing")) is None


@pytest.mark.engine
def test_the_fork_server_imports_vllm_so_the_sweep_process_does_not():
    """Workers fork from a server that imported vLLM; the sweep process itself stays free of it."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from specbench import engine\n"
        "ctx = engine.worker_context(None)\n"
        "print('parent:', ctx.get_start_method(), 'vllm' in sys.modules, 'torch' in sys.modules, flush=True)\n"
    )
    # The server's own import may print around this line (no log file here). That import takes tens of
    # seconds and proves nothing here: once the script has exited, the server (its session) is killed.
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    seen = []
    try:
        for output in proc.stdout:
            seen.append(output.rstrip("\n"))
            if output.startswith("parent:"):
                break
        returncode = proc.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert returncode == 0 and seen[-1:] == ["parent: forkserver False False"], "\n".join(seen)


@pytest.mark.parametrize(
    ("tokens", "drafts", "accepted", "passes"),
    [
        (5, None, None, 4),  # plain decoding: one pass per token after the first
        (9, 4, 4, 4),  # 8 tokens after the first: 4 passes of 1 + 1 accepted
        (9, 3, 7, 3),  # vLLM counted drafts accepted past max_tokens: at least one pass per draft
        (1, None, None, 0),  # only the prefill's token
    ],
)
def test_a_requests_decode_passes(tokens, drafts, accepted, passes):
    request = GeneratedRequest(tuple(range(tokens)), ttft_s=None, e2e_s=None, tpot_s=None,
                               drafts=drafts, accepted_tokens=accepted)
    assert request.decode_passes == passes


class TopTokensEngine(FakeEngine):
    """A FakeEngine whose untimed near-tie pass parts from the timed tokens at position 2 of request 1."""

    def top_tokens(self, prompts: Sequence[Sequence[int]], max_tokens: int, tolerance: float) -> list[TopTokens]:
        self.calls.append(("top_tokens", len(prompts)))
        results = []
        for p in prompts:
            ids = tuple(p[:1]) + (7,) * (max_tokens - 1)
            if p == (3, 4):
                ids = ids[:2] + (9,) + ids[3:]
            results.append(TopTokens(ids, tuple(0.5 + i for i in range(max_tokens)),
                                     tuple((i,) for i in range(max_tokens))))
        return results


def test_near_tie_pass_runs_last_untimed_and_stops_where_it_leaves_the_timed_tokens():
    fake = TopTokensEngine()
    m = measure(fake, plan(tie_tolerance=1.0))
    assert fake.calls[-2:] == [("top_tokens", 2), ("top_tokens", 2)]  # after the counters were read
    assert m.top2_margins[0] == [0.5, 1.5, 2.5, 3.5, 4.5]
    # Request 1's pass chose another token at position 2: its lists end there, inclusive.
    assert m.top2_margins[1] == [0.5, 1.5, 2.5] and m.near_tie_tokens[1] == [[0], [1], [2]]
    assert measure(FakeEngine(), plan()).top2_margins == []


def test_most_at_once_counts_overlapping_requests_and_not_back_to_back_waves():
    def request(start: float, end: float) -> GeneratedRequest:
        return GeneratedRequest((1,), None, None, None, scheduled_ts=start, finished_ts=end)

    assert most_at_once([request(0, 2), request(0, 2), request(1, 3)]) == 3
    # Two waves of two: the second starts when the first ends.
    assert most_at_once([request(0, 1), request(0, 1), request(1, 2), request(1, 2)]) == 2
    assert most_at_once([request(0, 1), GeneratedRequest((1,), None, None, None)]) is None


def test_accepted_drafts_cut_at_the_end_of_an_output_are_not_counted():
    # A looping request at max_tokens=32, K=4: 7 verify passes, each accepting all 4
    # drafts as vLLM counts them (28), yet only 31 tokens follow the prefill's: the
    # last pass's 4 accepted drafts and its bonus token were cut to one token.
    looping = GeneratedRequest((1,) * 32, None, None, None, drafts=7, accepted_tokens=28, last_accepted=4)
    assert looping.truncated_accepted == 4 and looping.emitted_accepted == 24
    assert looping.acceptance_length == pytest.approx(1 + 24 / 7)  # 4.43, not vLLM's 5.0
    assert looping.decode_passes == 7
    assert looping.truncated_per_position() == (1, 1, 1, 1)
    # An output that ended on a pass boundary loses nothing.
    whole = GeneratedRequest((1,) * 36, None, None, None, drafts=7, accepted_tokens=28, last_accepted=4)
    assert whole.truncated_accepted == 0 and whole.acceptance_length == pytest.approx(5.0)
    # Passes accepting 4 then 3 (10 tokens with the prefill's) cut to 9: the last pass gave
    # 3 tokens, its own and 2 accepted, so its highest accepted position no longer counts.
    cut = GeneratedRequest((1,) * 9, None, None, None, drafts=2, accepted_tokens=7, last_accepted=3)
    assert cut.truncated_accepted == 1 and cut.truncated_per_position() == (0, 0, 1)


def test_the_cut_the_engine_observed_decides_over_the_bound():
    # Prompt lookup: 3 passes without a draft hide the cut from the arithmetic bound
    # (7 + 28 - 34 = 1), but the engine saw its stop check cut 4 tokens.
    ngram = GeneratedRequest((1,) * 35, None, None, None, drafts=7, accepted_tokens=28, last_accepted=4, cut_tokens=4)
    assert ngram.truncated_accepted == 4 and ngram.emitted_accepted == 24
    assert ngram.truncated_per_position() == (1, 1, 1, 1)
    bound = GeneratedRequest((1,) * 35, None, None, None, drafts=7, accepted_tokens=28, last_accepted=4)
    assert bound.truncated_accepted == 1


def test_distribution_draws_go_in_calls_that_fit_one_engine_step():
    # vLLM 0.32's CPU build fails a seeded request whose prefill is chunked, so no call may
    # carry more prompt tokens than one step takes; the draws and their seeds stay in order.
    from specbench.measure import DistributionPlan, distribution_pass

    prompts = tuple(tuple(range(i, i + 40)) for i in range(4))
    check = DistributionPlan(prompts=2, samples=10, tokens=3, stream="s", prompt_tokens=32, step_tokens=100)
    plan = CellPlan(prompts=prompts, batch_size=1, max_tokens=8, repetitions=1,
                    sampling=Sampling(temperature=0.7), distribution=check)
    engine = FakeEngine()
    drawn = distribution_pass(engine, plan)
    sizes = [n for kind, n in engine.calls if kind == "generate"]
    assert sizes == [3] * 6 + [2] and max(sizes) * 32 <= 100  # 20 draws of 32-token prompts, 3 per call
    assert [len(p) for p in drawn.samples] == [10, 10]
    flat = [s for call in engine.seeds for s in call]
    assert flat == check.seeds(plan.seed, 0) + check.seeds(plan.seed, 1)
