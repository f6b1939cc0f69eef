"""The row format of every results file: its schema, and one rule each for reading rows.

Two kinds of files share one schema (:data:`SCHEMA`):

- ``cells/<cell_id>.parquet``: what one cell measured in one engine run,
  written by the job that measured it; beside it ``<cell_id>.tokens.parquet``
  (:data:`TOKENS_SCHEMA`) holds its output token ids. Comparison columns
  (speedup, exact_match) are null here: they need two cells.
- ``results.parquet``: one row per cell of the sweep, engine runs combined,
  with every speculative cell compared against its baseline
  (:mod:`specbench.results.merge`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Hashable, Iterable, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from specbench import methods, sampling

# 2: predicted_decode_speedup; target_passes >= requests + drafts; per-request acceptance
# 3: requests_fingerprint and provenance checks (resume, merge); merged columns describe every engine run;
#    speedup is the geometric mean of the per-run ratios; no zero-width intervals (null instead);
#    order-statistic intervals over repetitions with their coverage; exactness mismatches flagged;
#    mismatched_requests counts requests, not requests x engine runs
# 4: memory columns (weights, KV cache, peaks, predicted)
# 5: engine runs are named so (engine_run, engine_runs, speedup_per_engine_run; were pass_index, passes,
#    speedup_per_pass): "pass" is kept for a target forward pass (target_passes, tokens_per_pass)
# 6: output_tokens_per_request, decode_passes_per_request (the wall time's slowest-request tail)
# 7: verdicts a user can reach: exactness classified per request (exactness, differing_requests,
#    tie_requests, divergences, top-two margins from the baseline), caveats that qualify without
#    excluding, attempts of a disturbed cell, the speedup's pooled spread and df, acceptance counted
#    on emitted tokens (raw_* keep vLLM's counters), reached concurrency
# 8: machine (was hardware): the machine a cell ran on, where hardware= names an analytic profile
# 9: method_label (the method's variant and K, from the method registry: what plots and tables group on)
# 10: k_schedule (the per-batch-size K schedule a cell ran with, [[first, last, K], ...]; null at a fixed K);
#     sampling (temperature, top_p, top_k, seed_rule) and the distribution check of sampled cells
#     (distribution_samples, its cost, p-value, Holm-adjusted p-value and power)
# 11: vllm_fixes (the repairs of known vLLM defects applied to the cell's engine, comma-separated;
#     empty: none; specbench.engine.fixes)
# 12: like-for-like speedups (the ratio of time per output token; output_token_ratio, the cell's output
#     tokens over its baseline's); speedup_df counts independent engines, and the spread's split into
#     the baseline engine's own and a speculative engine's (baseline_engine_log_sd, speculative_engine_log_sd);
#     speedup_df a real number (Satterthwaite's); exactness "untested" (a distribution check whose draws
#     reached no verification)
# 13: serving cells (load.request_rate; specbench.results.serving): the load met, achieved throughput,
#     goodput, ITL and queueing-delay percentiles, the running batch over time, and (results.parquet)
#     speedups at the same offered load with their intervals, whether the cell pays, the model's prediction
# 14: the engine's mode as vLLM resolved it (engine_model_runner, engine_async_scheduling,
#     engine_cudagraph_mode, engine_cudagraph_capture_sizes, engine_max_cudagraph_capture_size,
#     engine_max_num_batched_tokens, engine_max_num_seqs, engine_prefix_caching) and, in results.parquet,
#     mode_mismatch: how a speculative cell's engine ran otherwise than its baseline's;
#     model_revision, drafter_revision (the hub commit of the target's and the drafter's checkpoint: the
#     snapshot the engine loaded, specbench.hub; null for embedded, shipped and local checkpoints);
#     baseline_shift_checked (whether the shifted-baseline test could judge a cell's baseline); sampled
#     cells run to max_tokens (min_tokens = max_tokens, part of their identity); exactness "untested" also
#     for a distribution check weaker than distribution.MAX_DETECTABLE_TV;
#     engine_id (the engine instance a cell ran on, named as it started; results.parquet: its engine runs'
#     ids in engine-run order, comma-separated): spreads, df and flags group cells by the engines they shared;
#     serving (specbench.results.serving): the offered rate the schedule realised and each engine run's
#     arrival seed, throughput and goodput over the send span, SLO attainment with Wilson's interval, per-request
#     TPOT mean and std, queue growth and TTFT slope, saturated and why, load_ignore_eos, the engine's usage
#     context, the serving spread's method, zero-goodput runs named
# 15: serving: the client's queue, each measured request's wait from its scheduled arrival to its send
#     (wait_to_send_s_p50/p90; a slot under load.max_concurrency) and its E2E from the arrival
#     (e2e_from_arrival_s_p50/p90); a closed loop (rate inf under load.max_concurrency) is read against
#     its sends (offered_rate_realised) and not saturated by construction; burstiness away from 1 in
#     the cell id (-burst<B>); engine_allocator (the malloc each engine's worker ran with, engine.cpu_allocator)
#     and engine_huge_page_bytes (its memory in transparent huge pages: CPU engines ask for them by default,
#     engine.cpu_huge_pages); load_via (a serving cell in process or through vllm serve)
# 16: vllm_plugins (the general plugins vLLM loaded into each engine); serving: warm-ups sent as a burst of
#     their own before the measured clock, completions counted over the send span shifted by the median
#     E2E and judged with a permutation p-value, trends by their interval's lower end; a closed loop's
#     wait_to_send_s_* and e2e_from_arrival_s_* null and its offered rate without the burst that fills its
#     slots; through the server, acceptance per request from the final usage chunk; speedup intervals and
#     the disagreement test on the engine-to-engine spread of the cell's batch size
# 17: confirmation_* (confirm=true: the verdict's cell measured again on fresh engines and judged on those
#     runs alone); through the server, server_metrics_acceptance and server_metrics_note (/metrics over
#     the measured requests alone, the cross-check of their usage chunks) and queue_s_* filled
SCHEMA_VERSION = 17
_STR, _INT, _F, _BOOL = pa.string(), pa.int64(), pa.float64(), pa.bool_()
# Where a request's output first leaves its reference (the baseline; for a baseline, plain decoding
# at batch 1) and why: "tie" when the token emitted there is in the reference's own tied set (its
# near-top tokens within the dtype's tolerance), else "mismatch".
DIVERGENCE = pa.struct([("request", _INT), ("position", _INT), ("kind", _STR), ("margin", _F)])
SCHEMA = pa.schema(
    [
        ("schema_version", _INT),
        ("cell_id", _STR),
        ("baseline_cell_id", _STR),
        ("status", _STR),  # ok | failed
        ("error", _STR),
        # --- the cell --------------------------------------------------------
        ("model", _STR),
        ("method", _STR),
        ("method_label", _STR),  # "ngram K=4", "controlled alpha=0.6 K=4", "draft_model/small K=2" (specbench.methods.label)
        ("num_speculative_tokens", _INT),  # with a k_schedule: its largest K
        ("k_schedule", pa.list_(pa.list_(_INT))),  # method.k_schedule: [[first batch size, last, K], ...]; null: fixed K
        ("batch_size", _INT),
        ("workload", _STR),
        ("engine_run", _INT),  # null in results.parquet (engine runs combined)
        ("engine_runs", _INT),
        # uuid4 hex named by the worker as its engine started; results.parquet: the engine runs' ids in
        # engine-run order, comma-separated (null where a run was stored before schema 14: see engine_instance)
        ("engine_id", _STR),
        ("repetitions", _INT),
        ("num_requests", _INT),
        ("prompt_tokens", _INT),
        ("output_tokens", _INT),  # per repetition
        # --- time ------------------------------------------------------------
        # Merged rows: every column describes all engine runs (see _across_engine_runs).
        ("wall_time_s", _F),  # one engine run: median of its repetitions; merged: geometric mean of the runs' medians
        ("wall_time_s_ci_low", _F),  # order-statistic (one run) or engine runs as clusters (t on log); see reps_ci_coverage
        ("wall_time_s_ci_high", _F),
        ("wall_time_s_cv", _F),
        ("wall_time_s_reps", pa.list_(_F)),
        ("tokens_per_s", _F),
        ("tokens_per_s_ci_low", _F),
        ("tokens_per_s_ci_high", _F),
        ("reps_ci_coverage", _F),  # 1 engine run: exact order-statistic coverage (0.75 for 3 reps); more: 0.95, runs as clusters
        # Latency percentiles are over the requests of one engine run; merged rows hold their median over engine runs.
        ("ttft_s_p50", _F),
        ("ttft_s_p90", _F),
        ("ttft_s_p99", _F),
        ("tpot_s_p50", _F),
        ("tpot_s_p90", _F),
        ("tpot_s_p99", _F),
        ("tpot_s_mean", _F),  # token-weighted: total decode time / tokens after each request's first (mean over runs)
        ("e2e_s_p50", _F),
        ("e2e_s_p90", _F),
        ("e2e_s_p99", _F),
        ("latency_note", _STR),
        ("warmup_s", _F),
        ("engine_start_s", _F),
        # --- acceptance (vLLM counters, differenced around the timed region) --
        ("drafts", _INT),
        ("draft_tokens", _INT),
        ("accepted_tokens", _INT),
        ("acceptance_length", _F),  # 1 + accepted / drafts, over steps with a draft
        ("acceptance_rate_per_pos", pa.list_(_F)),  # accepted at i / drafts that reached position i
        ("drafted_per_pos", pa.list_(_INT)),  # drafts that reached each position (empty: not reported)
        ("draft_acceptance_rate", _F),  # accepted / draft tokens
        ("alpha", _F),  # fitted per-token acceptance (stats.acceptance.fit_alpha)
        ("target_passes", _INT),  # max(output - accepted, requests + drafts), see measured_fields
        ("tokens_per_pass", _F),  # output tokens / target passes, prefill and undrafted passes included
        ("draft_coverage", _F),  # drafts / target passes
        ("acceptance_length_per_request", pa.list_(_F)),  # each request's own (null: never drafted); median over engine runs
        # Per request, in submission order (first timed repetition; median over engine runs): what a
        # batch's slowest request makes the wall time pay (specbench.analytic.speedup.batch_decode_time).
        ("output_tokens_per_request", pa.list_(_INT)),
        ("decode_passes_per_request", pa.list_(_INT)),  # target passes after the prefill's (= output - 1 without speculation)
        ("acceptance_length_p50", _F),  # median of the above over requests that drafted
        # vLLM's own counters, before accepted tokens past max_tokens or a stop token are removed
        # (the columns above count only accepted tokens that reached the output).
        ("raw_accepted_tokens", _INT),
        ("raw_acceptance_length", _F),
        ("raw_acceptance_rate_per_pos", pa.list_(_F)),
        # Baselines in a 16-bit dtype only: each request's top-1 minus top-2 log-probability at every
        # output position (an untimed pass after the timed ones), and the other tokens within the tie
        # tolerance of the top one there: what tells a numerical tie from a mismatch.
        ("top2_margins", pa.list_(pa.list_(_F))),
        ("near_tie_tokens", pa.list_(pa.list_(pa.list_(_INT)))),
        # Sampled cells (temperature > 0) only: the distribution check (specbench.results.distribution).
        # Per prompt of the check, per sample, its first tokens (an untimed pass after the timed ones).
        ("distribution_samples", pa.list_(pa.list_(pa.list_(_INT)))),
        ("distribution_check_s", _F),  # the pass's seconds (merged: summed over engine runs)
        ("distribution_check_share", _F),  # ... over the cell's timed seconds (all repetitions)
        ("distribution_drafts", _INT),  # drafts verified during the pass (0: it exercised no drafting)
        ("distribution_accepted_tokens", _INT),
        ("distribution_p_value", _F),  # permutation test against the baseline's samples (results.parquet)
        ("distribution_p_adjusted", _F),  # ... Holm-adjusted over the sweep's checked cells; < 0.05: mismatch
        ("distribution_power_tv", _F),  # total-variation distance detected with 80% power (null: none tried)
        ("repetitive_requests", _INT),  # outputs caught in a loop (REPETITIVE_SHARE of 4-grams repeated); max over engine runs
        # --- comparison with the baseline (results.parquet only) ---------------
        # Baseline time per output token / this cell's (the wall-time ratio where outputs are equal in
        # length): geometric mean over engine runs.
        ("speedup", _F),
        ("speedup_ci_low", _F),  # null when there is no interval (speedup_ci_method says why)
        ("speedup_ci_high", _F),
        ("speedup_ci_method", _STR),
        ("speedup_rerun_low", _F),  # where an identical rerun is expected to land (95%)
        ("speedup_rerun_high", _F),
        ("speedup_per_engine_run", pa.list_(_F)),
        # The interval's ingredients, so that any other interval (simultaneous over m cells, another
        # confidence) can be rebuilt: sd of one engine run's log speedup, and its degrees of freedom.
        ("speedup_log_sd", _F),
        # Counted in independent engines (stats.spreads.engine_run_spread; Satterthwaite's, not whole).
        ("speedup_df", _F),
        # The spread split into the baseline engine's own deviation and a speculative engine's (sd of log
        # speed, pooled over the sweep; null where one speculative engine per baseline cannot tell them apart).
        ("baseline_engine_log_sd", _F),
        ("speculative_engine_log_sd", _F),
        ("output_token_ratio", _F),  # this cell's output tokens / its baseline's (geometric mean over engine runs)
        ("decode_speedup", _F),  # baseline tpot_s_mean / this cell's: decode time ratio (own prefill excluded)
        ("exact_match", _BOOL),  # token for token (the check as it is for float32)
        # Speculative cells against their baseline; a baseline at batch B against plain decoding at
        # batch 1 (the control: how often plain decoding disagrees with itself).
        ("exactness", _STR),  # exact | ties | mismatch; sampled: distribution | untested | mismatch; null when unknown
        ("differing_requests", _INT),  # requests whose tokens differ in any engine run
        ("tie_requests", _INT),  # ... first diverging at a numerical tie
        ("mismatched_requests", _INT),  # ... first diverging where the reference had a clear winner
        ("divergences", pa.list_(DIVERGENCE)),  # each differing request's first divergence (engine run 0 first)
        ("exactness_reference", _STR),  # the cell compared with for the above
        ("tie_tolerance", _F),  # nats: the dtype's margin below which a divergence is a tie
        ("outputs_stable", _BOOL),  # every repetition of every engine run produced the same tokens
        ("flagged", _BOOL),  # see flag_reasons: treat this speedup with care
        ("flag_reasons", pa.list_(_STR)),
        # Whether stats.baseline_shifts.shifted_baselines could test this cell's baseline for an engine run that
        # went off alone (false: one speculative configuration per baseline, or too few baseline cells per engine;
        # null: one engine run, or a baseline).
        ("baseline_shift_checked", _BOOL),
        # confirm=true (specbench.confirm), on the cell a verdict chose: the same cell measured again with its
        # baseline, engine_runs times on fresh engines, merged apart from the grid (its own intervals, from those
        # runs alone); the confirmation's cell id (engine run 0), speedup and 95% interval, and why it cannot judge
        # (failed, flagged, mismatched outputs; null when it can). Null elsewhere.
        ("confirmation_cell_id", _STR),
        ("confirmation_speedup", _F),
        ("confirmation_ci_low", _F),
        ("confirmation_ci_high", _F),
        ("confirmation_not_judged", _STR),
        # What qualifies a speedup without excluding it from verdicts (looping outputs, ties).
        ("caveats", pa.list_(_STR)),
        # How the cell's engine ran otherwise than its baseline's, in timing-relevant mode (model runner,
        # async scheduling, graph mode and coverage of the step, step budget, prefix caching); null: alike.
        ("mode_mismatch", _STR),
        ("attempts", _INT),  # measurements of this cell on its engine: > 1 when other processes disturbed it
        ("other_cpu_share_per_attempt", pa.list_(_F)),  # the disturbance of each attempt; the least one is kept
        ("load_avg_1m", _F),  # machine load while the cell ran (max over runs)
        ("other_cpu_share", _F),  # share of the cores other processes kept busy while the cell ran
        ("cpu_cores", _INT),
        ("gpu_state", _STR),  # clocks and memory as the driver reported them
        # --- the analytic model beside the measurement (results.parquet only; specbench.analytic.prediction)
        ("controlled_alpha", _F),  # method=controlled: the per-token acceptance it was set to
        ("predicted_speedup", _F),  # roofline model, prefill included, this row's acceptance
        ("predicted_decode_speedup", _F),  # ... decode only (held against decode_speedup)
        ("predicted_speedup_bs1_alpha", _F),  # ... with tokens_per_pass measured at batch size 1
        ("hardware_profile", _STR),  # the hardware profile priced with, and its source
        ("prediction_note", _STR),  # why a prediction is null
        # --- memory (specbench.analytic.memory; bytes, tokens) ------------------------------
        ("target_weight_bytes", _INT),  # loaded parameters of the target
        ("drafter_weight_bytes", _INT),  # ... of the draft model or EAGLE head (0: none)
        ("kv_cache_blocks", _INT),  # KV cache vLLM allocated: blocks
        ("kv_block_size", _INT),  # ... tokens per block
        ("kv_cache_tokens", _INT),  # ... blocks x block size
        ("kv_bytes_per_token", _INT),  # ... bytes per token, target and drafter layers summed
        ("kv_cache_bytes", _INT),
        ("kv_request_tokens", _INT),  # slots one request of this cell takes (longest prompt + max_tokens + K)
        ("kv_requests_fit", _INT),  # such requests the KV cache holds at once
        ("reached_concurrency", _INT),  # most requests vLLM ran at once (below batch_size: it ran in waves)
        ("drafter_kv_share", _F),  # 1 - kv_cache_tokens / the baseline's (results.parquet only)
        ("peak_gpu_allocated_bytes", _INT),  # torch.cuda.max_memory_allocated in the worker
        ("peak_gpu_reserved_bytes", _INT),  # torch.cuda.max_memory_reserved
        ("gpu_used_bytes", _INT),  # NVML's used device memory after the cell
        ("peak_rss_bytes", _INT),  # CPU: the worker's peak resident memory (VmHWM)
        ("predicted_weight_bytes", _INT),  # the memory model (footprint.engine_memory): target + drafter
        ("predicted_kv_bytes_per_token", _INT),
        ("predicted_kv_cache_tokens", _INT),
        ("predicted_peak_bytes", _INT),
        # --- serving cells only (load.request_rate set; specbench.results.serving) ------------
        # Latency columns above hold the client's figures over the measured requests (warm-up left
        # out), and wall_time_s the measured window (first measured send to last measured token).
        ("load_request_rate", _F),  # offered, requests/s (inf: all at once)
        ("load_burstiness", _F),
        ("load_max_concurrency", _INT),
        ("load_warmup_requests", _INT),
        ("load_ignore_eos", _BOOL),  # every request decoded max_tokens (EOS ignored)
        ("arrival_seed", _INT),  # the engine run's arrival schedule (load.arrival_seed; a cell and its baseline share it)
        ("arrival_seeds", pa.list_(_INT)),  # merged: each engine run's, in engine-run order
        ("engine_usage_context", _STR),  # vLLM usage context the serving engine started in (vllm serve's)
        ("load_via", _STR),  # inprocess (AsyncLLM in the worker) | server (vllm serve over HTTP)
        # Through the server: 1 + accepted / drafts from its /metrics counters over the measured requests
        # alone (first measured send to last measured token), the cross-check of their own counts; and
        # why the two disagree beyond rounding (per engine run; null where they agree or in process).
        ("server_metrics_acceptance", _F),
        ("server_metrics_note", _STR),
        ("offered_rate_realised", _F),  # measured requests' sends: (n - 1) / (last - first), from the schedule
        ("offered_rate_realised_per_engine_run", pa.list_(_F)),  # merged: each engine run's
        ("served_requests", _INT),  # measured requests (after the warm-up)
        ("serving_window_s", _F),  # the send span: first measured send to last (rate inf: to the last token)
        ("achieved_request_rate", _F),  # requests (warm-up included) completed inside the send span, over it
        ("achieved_output_tokens_per_s", _F),  # every token streamed inside the send span, over it
        ("goodput", _F),  # achieved_request_rate x slo_attainment (as vLLM: good / duration); null without a target
        ("slo_met_requests", _INT),  # measured requests meeting every load.slo.* target (merged: every engine run's)
        ("slo_attainment", _F),  # their share of the measured requests
        ("slo_attainment_ci_low", _F),  # Wilson score 95% interval over the measured requests (pooled engine runs)
        ("slo_attainment_ci_high", _F),
        ("tpot_s_request_mean", _F),  # TPOT mean over requests, as vllm bench serve's mean_tpot (tpot_s_mean: per token)
        ("tpot_s_std", _F),  # TPOT standard deviation over requests (vllm bench serve's std_tpot)
        ("queue_growth_per_s", _F),  # slope of vLLM's waiting count over the send span's engine steps
        ("ttft_slope", _F),  # slope of the measured requests' TTFT against their send time (s per s)
        ("saturated", _BOOL),  # the engine fell behind the load (specbench.results.serving.saturation); not judged
        ("saturation_reason", _STR),  # why, per engine run (a speculative cell's: also its baseline's)
        ("itl_s_p50", _F),  # gaps between streamed chunks, pooled over requests
        ("itl_s_p90", _F),
        ("itl_s_p99", _F),
        ("queue_s_p50", _F),  # the engine's queueing delay: queued to first scheduled
        ("queue_s_p90", _F),
        ("queue_s_p99", _F),
        ("queue_s_mean", _F),
        # The client's queue: scheduled arrival to send (a slot under load.max_concurrency), and E2E from arrival.
        ("wait_to_send_s_p50", _F),
        ("wait_to_send_s_p90", _F),
        ("e2e_from_arrival_s_p50", _F),
        ("e2e_from_arrival_s_p90", _F),
        ("running_batch_mean", _F),  # time-weighted over the window's engine steps (scheduler stats)
        ("running_batch_p90", _F),
        ("running_batch_max", _INT),
        ("running_batch_t_s", pa.list_(_F)),  # each step, seconds from the window's start (merged: engine run 0)
        ("running_batch", pa.list_(_INT)),
        # Against the baseline at the same offered load (same arrival times, same prompts), results.parquet only.
        ("serving_speedup_tpot_p50", _F),
        ("serving_speedup_tpot_p50_ci_low", _F),
        ("serving_speedup_tpot_p50_ci_high", _F),
        ("serving_speedup_e2e_p50", _F),
        ("serving_speedup_e2e_p50_ci_low", _F),
        ("serving_speedup_e2e_p50_ci_high", _F),
        ("serving_speedup_e2e_p90", _F),
        ("serving_speedup_e2e_p90_ci_low", _F),
        ("serving_speedup_e2e_p90_ci_high", _F),
        ("serving_speedup_goodput", _F),
        ("serving_speedup_goodput_ci_low", _F),
        ("serving_speedup_goodput_ci_high", _F),
        ("serving_speedup_ci_method", _STR),  # the E2E p50 interval's method and the regime its spread pooled
        ("serving_goodput_note", _STR),  # engine runs whose goodput was 0 (then no goodput speedup)
        ("serving_pays", _BOOL),  # E2E p50 speedup's interval above 1 (specbench.results.serving.pays)
        # The analytic model at the measured mean running batch (specbench.analytic.prediction).
        ("serving_predicted_speedup", _F),
        ("serving_predicted_tpot_s", _F),
        # --- provenance --------------------------------------------------------
        ("specbench_version", _STR),
        ("git_commit", _STR),
        ("model_revision", _STR),  # the hub commit of the target's snapshot (specbench.hub); null: not from the hub
        ("drafter_revision", _STR),  # ... of the draft model's or head's snapshot
        ("vllm_version", _STR),
        ("torch_version", _STR),
        ("transformers_version", _STR),
        ("vllm_fixes", _STR),  # repairs of known vLLM defects applied to the engine ("vllm#55005"); "": none
        ("engine_allocator", _STR),  # the malloc the engine's worker ran with: tcmalloc, jemalloc, glibc
        ("engine_huge_page_bytes", _INT),  # the worker's memory in transparent huge pages once built (CPU)
        ("vllm_plugins", _STR),  # general plugins vLLM loaded into the engine, comma-separated; "": none
        ("python_version", _STR),
        ("machine", _STR),  # GPU name and count, or CPU model and cores (hardware_profile: the priced profile)
        # The engine's mode as vLLM resolved it, read from the running engine's vllm_config.
        # V1 | V2 (vLLM 0.32: V2 on CUDA, but V1 for custom_class, suffix and heterogeneous-vocabulary drafts;
        # V1 on the CPU build)
        ("engine_model_runner", _STR),
        ("engine_async_scheduling", _BOOL),  # scheduler_config.async_scheduling (off for ngram, and on CPU)
        ("engine_cudagraph_mode", _STR),  # compilation_config.cudagraph_mode: NONE, PIECEWISE, FULL_AND_PIECEWISE, ...
        ("engine_cudagraph_capture_sizes", pa.list_(_INT)),  # step sizes (tokens) with a captured graph
        ("engine_max_cudagraph_capture_size", _INT),  # the largest of them; 0: none captured
        ("engine_max_num_batched_tokens", _INT),  # the step budget as resolved
        ("engine_max_num_seqs", _INT),
        ("engine_prefix_caching", _BOOL),  # cache_config.enable_prefix_caching as resolved
        ("host", _STR),
        ("started_at", _STR),  # ISO 8601, UTC
        ("dtype", _STR),
        ("enable_prefix_caching", _BOOL),
        ("enforce_eager", _BOOL),
        ("max_model_len", _INT),
        ("seed", _INT),
        ("temperature", _F),  # 0: greedy decoding
        ("top_p", _F),
        ("top_k", _INT),
        ("seed_rule", _STR),  # sampled cells: how each request's seed follows from seed (specbench.sampling)
        ("workload_source", _STR),
        ("workload_fingerprint", _STR),  # sha256 of the workload's source file
        ("requests_fingerprint", _STR),  # sha256 of the exact requests: prompt token ids and max_tokens
        ("prompt_ids", pa.list_(_STR)),
        ("skipped_too_long", _INT),
        ("config_hash", _STR),
        ("config_json", _STR),
    ]
)
COLUMNS = SCHEMA.names
TOKENS_SCHEMA = pa.schema([("request_index", _INT), ("prompt_id", _STR), ("token_ids", pa.list_(_INT))])


RESULTS_FILE = "results.parquet"
# vLLM's per-batch-size K schedule inside speculative_config (set from method.k_schedule).
SCHEDULE_KEY = methods.SCHEDULE_KEY



RENAMED_COLUMNS = {"hardware": "machine"}  # schema 8: the column holds the machine, not the analytic profile
"""Old column name -> new, for files an older specbench wrote."""


class ResultsError(RuntimeError):
    """A results file that cannot be read or does not follow the schema."""


def rows_to_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """Rows (dicts keyed by column) as a table with :data:`SCHEMA`; unknown keys are an error."""
    for row in rows:
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise ResultsError(f"columns not in the schema: {sorted(unknown)}")
    return pa.Table.from_pylist([{c: row.get(c) for c in COLUMNS} for row in rows], schema=SCHEMA)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Read a results or cell file; :class:`ResultsError` names the file if it is unreadable.

    Every column of :data:`SCHEMA` is present in the returned rows.
    """
    check_results_file(path)
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for damaged files
        raise ResultsError(f"{path}: not a readable Parquet file ({exc})") from exc
    # Columns added since the file was written read as null, and renamed ones under
    # their new name: a newer specbench still merges (and resumes from) cells
    # measured by an older one. Their method_label is made from their config,
    # as it would have been written.
    rows = table.to_pylist()
    for row in rows:
        for old, new in RENAMED_COLUMNS.items():
            if old in row and new not in row:
                row[new] = row.pop(old)
    return [{c: row.get(c) for c in COLUMNS} | row | {"method_label": method_label(row)} for row in rows]


# Columns every results and cell file has carried since the first schema: a Parquet file without one of
# them was not written by specbench.
IDENTIFYING_COLUMNS = ("schema_version", "cell_id", "status")


def check_results_file(path: Path) -> None:
    """:class:`ResultsError`, in one line naming ``path``, unless it is a specbench results or cell file.

    Reads the footer only, so that every command that takes results refuses a
    damaged file, or another program's Parquet, before reading (or drawing) anything.
    """
    try:
        names = pq.read_schema(path).names
    except Exception as exc:  # pyarrow raises several types for damaged files
        raise ResultsError(f"{path}: not a readable Parquet file ({exc})") from exc
    missing = [c for c in IDENTIFYING_COLUMNS if c not in names]
    if missing:
        raise ResultsError(f"{path}: not a specbench results file (no column {', '.join(missing)}; it has "
                           f"{', '.join(names[:5]) or 'none'}{', ...' if len(names) > 5 else ''})")


# --- reading rows: one rule each, for the report, the CLIs and the sweep ----------------------------


def results_path(path: Path | str) -> Path:
    """The results file of a sweep directory (:data:`RESULTS_FILE`), or ``path`` itself when it is a file."""
    path = Path(path)
    return path / RESULTS_FILE if path.is_dir() else path


def checked_results_path(path: Path | str) -> Path:
    """:func:`results_path`, checked: FileNotFoundError where there is none, :class:`ResultsError` where it
    is not a readable specbench results file (:func:`check_results_file`: the footer only)."""
    found = results_path(path)
    if not found.is_file():
        raise FileNotFoundError(f"no results file at {found}")
    check_results_file(found)
    return found


def row_config(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row's resolved cell config (``config_json``); {} when absent or unreadable."""
    try:
        config = json.loads(row.get("config_json") or "{}")
    except (TypeError, json.JSONDecodeError):
        return {}
    return config if isinstance(config, dict) else {}


def method_label(row: Mapping[str, Any]) -> str | None:
    """A row's ``method_label``; for a row written before the column (schema 7 and older), the one
    :func:`specbench.methods.label` makes from its config. None without a method (a failed config)."""
    if row.get("method_label") is not None:
        return str(row["method_label"])
    if row.get("method") is None:
        return None
    config = {**(row_config(row).get("method") or {}), "name": row["method"]}
    return methods.label(config, int(row.get("num_speculative_tokens") or 0))


def method_variant(row: Mapping[str, Any]) -> str | None:
    """A row's method and its own keys without K (``controlled alpha=0.6``): what a family of
    curves over K shares (:func:`specbench.methods.variant`). None without a method."""
    if row.get("method") is None:
        return None
    return methods.variant({**(row_config(row).get("method") or {}), "name": row["method"]})


def curve_key(row: Mapping[str, Any], *, across_k: bool = False) -> str:
    """What a batch-size curve shares: everything that decides a cell except batch size and engine run.

    Two rows with equal keys differ only in batch size (and engine run): they are
    points of one speedup curve (break-even, batch-size-1 acceptance). With
    ``across_k`` K and any per-batch-size K schedule are left out too, so the
    key names a family of curves over which K is chosen (the K schedule).
    """
    cfg = row_config(row)
    method = dict(cfg.get("method") or {})
    speculative = dict(method.get("speculative_config") or {})
    k: Any = row.get("num_speculative_tokens")
    if across_k:
        speculative.pop("num_speculative_tokens", None)
        speculative.pop(SCHEDULE_KEY, None)
        method.pop(methods.SCHEDULE, None)
        k = None
    method["speculative_config"] = speculative or None
    key = {"model": cfg.get("model"), "model_name": row.get("model"), "method": method,
           "method_name": row.get("method"), "k": k, "workload": cfg.get("workload"),
           "engine": cfg.get("engine")}
    # Sampling decides acceptance (alpha falls as the target's distribution flattens): rows at
    # another temperature are another curve. Greedy rows (and rows written before these keys) add nothing.
    key |= sampling.identity_keys(cfg)
    return json.dumps(key, sort_keys=True, default=str)


def engine_key(row: Mapping[str, Any]) -> str:
    """What decides the engine a row's cell ran on, but for the engine run: its :func:`curve_key` without the
    workload and the sampling settings, with whether it served (vLLM's async engine, not the offline one).
    One engine of each key serves every workload, batch size, temperature and offered load of an engine
    run, so cells with equal keys share that engine's deviations. The load's rate, burstiness and
    concurrency cap are the client's: they start no other engine (:class:`specbench.engine.EngineSpec`
    has none of them).

    Only an inference, for rows stored before schema 14: rows since name their engine
    (:func:`engine_instance`), which also tells apart grids merged into one directory and cells measured
    again (``remeasure=flagged``), which no config can."""
    cfg = row_config(row)
    key = json.loads(curve_key(row))
    for name in ("workload", *sampling.identity_keys(cfg)):
        key.pop(name, None)
    key["seed"] = row.get("seed")
    if row.get("load_request_rate") is not None or (cfg.get("load") or {}).get("request_rate") is not None:
        key["serving"] = True  # an offline key stays what it was
    return json.dumps(key, sort_keys=True, default=str)


INFERRED = "inferred:"
"""The prefix of an engine instance inferred from a row's config (:func:`engine_instance`)."""


def engine_instance(row: Mapping[str, Any]) -> str:
    """The engine instance a cell file's row ran on: its ``engine_id``; for a row stored before schema 14,
    inferred as its :func:`engine_key` in its engine run (prefixed :data:`INFERRED`), the reading of
    schema 13 and older."""
    if row.get("engine_id"):
        return str(row["engine_id"])
    return f"{INFERRED}{engine_key(row)}#r{row.get('engine_run') or 0}"


def engine_groups(instances: Sequence[Iterable[Hashable]]) -> list[Hashable]:
    """A label per item for the items that shared any engine instance, directly or through others.

    ``instances``: per item (a speculative cell), the baseline engine instances of its engine runs
    (:func:`engine_instance`). Cells whose baselines ran on one engine share its deviation in that
    engine run; a cell measured in an extra run, or one that joins from another grid, still shares
    the others. Cells measured again on fresh engines share nothing with the old ones: a group
    of their own.
    """
    parent: dict[Hashable, Hashable] = {}

    def root(x: Hashable) -> Hashable:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    listed = [list(item) for item in instances]
    for item in listed:
        for other in item[1:]:
            parent[root(other)] = root(item[0])
    return [root(item[0]) if item else None for item in listed]


def recommendable(row: Mapping[str, Any]) -> bool:
    """Whether a speculative row may be judged: named best, chosen for a K schedule, given a verdict.

    The one eligibility rule of every decision (verdicts, best configuration,
    K schedule, the memory table's best speedup). The row must have run to
    the end and have a speedup; its outputs must not *mismatch* the
    baseline's: ``exactness`` "exact" or "ties" (divergences at numerical
    ties of the baseline's top two tokens, which bfloat16 kernels of another
    shape break differently) are judged, "mismatch" is not. Files of schema
    6 and older have no ``exactness``: there ``exact_match`` False is a
    mismatch, as it was then. Unknown exactness is allowed (lost token
    files). A flagged row (disturbed after every attempt, engine runs that
    disagree, different hardware, real mismatches) is shown, never judged;
    ``caveats`` (looping outputs, ties) qualify a verdict and exclude nothing.
    """
    return (
        row.get("status") == "ok"
        and row.get("method") != "baseline"
        and _known(row.get("speedup"))
        and exactness_kind(row) != "mismatch"
        and not row.get("flagged")
    )


def exactness_kind(row: Mapping[str, Any]) -> str | None:
    """``"exact"``, ``"ties"`` or ``"mismatch"``; None when unknown.

    Files of schema 6 and older have no ``exactness``: there ``exact_match``
    decides, False being a mismatch as it was then.
    """
    kind = row.get("exactness")
    if kind is not None:
        return str(kind)
    match = row.get("exact_match")
    return None if match is None else ("exact" if match else "mismatch")


def _known(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))
