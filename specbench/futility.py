"""``futility=true``: a configuration that cannot pay gets no more engine runs than it needs to show it.

A verdict turns on 1x: a configuration pays when its speedup's interval, widened over the configurations it is
chosen from (:func:`specbench.analytic.verdicts.best_row`), lies above 1. One measured well below 1 is a
configuration whose further engine runs buy no decision. The sweeper therefore measures a sweep in three steps
(:meth:`specbench.sweep.CellSweeper.sweep`):

1. engine run 0 of every cell;
2. the later engine runs of every baseline and of every configuration whose speedup in run 0 is at least 1 (or
   unknown: failed, not compared) or that step 3 could not stop (its batch size has no more speculative engines
   than :data:`MIN_GOING_ON`, which all go on) or whose engine goes on for other cells, as the grid orders them
   (:func:`later_now`);
3. the sweep merged as the finish merges it; each configuration left, measured once, gets its later engine runs
   only while its interval reaches 1: it stops (is *settled*) where its 95% interval, on the engine-to-engine
   spread the other configurations measured, lies below 1 (:func:`settled`).

A settled configuration's point estimate lies below 1, so its lower end does, however the verdict widens it: it
can never be said to pay, and stopping it adds no false "pays". The configurations that do pay keep every engine
run, so the verdict's interval is theirs, as before; but a settled configuration adds no engine-to-engine
deviation to the pooled spread after run 0, so the spread's degrees of freedom are those of the configurations
that went on (docs/methodology.md, "Stopping for futility"). Its later runs, where it is not settled, pair with
baselines measured earlier in the sweep, not alongside them.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence, Set
from typing import Any

from specbench.analytic.verdicts import has_interval
from specbench.grid import PlannedCell
from specbench.results.schema import recommendable


# A settled configuration leaves the pooled spread with the engines of the configurations that go on. At two
# engine runs each has one degree of freedom of engine-to-engine spread to give: six configurations that became
# three take Satterthwaite's df from 2.7 to 2.0 at equal engine deviations (specbench.analytic.sizing.engine_df;
# t from 3.46 to 4.30, the intervals of those that pay a quarter wider); at three runs from 5.3 to 4.0 (t from
# 2.52 to 2.78, a tenth): futility stops only configurations of three engine runs or more.
MIN_ENGINE_RUNS = 3


def asking(planned: Sequence[PlannedCell]) -> set[str]:
    """Config hashes of the speculative cells that ask for futility (``futility=true``) and have at least
    :data:`MIN_ENGINE_RUNS` engine runs."""
    return {p.cell.config_hash for p in planned
            if p.cell.engine_run > 0 and not p.cell.is_baseline and p.cell.config.get("futility")
            and int(p.cell.config.get("engine_runs") or 1) >= MIN_ENGINE_RUNS}


def below_one(rows: Sequence[Mapping[str, Any]], among: set[str]) -> set[str]:
    """Config hashes (of ``among``: :func:`asking`) of the offline speculative rows whose speedup is below 1, at
    a batch size where :func:`settled` may stop some (:func:`settle_room`), on an engine all of whose cells are
    such: after engine run 0, the configurations whose later runs wait for it. Where it may stop none, waiting
    would only measure them later, apart from the baselines they pair with; where their engine serves other
    cells that go on (one engine serves every batch size and workload of its method and K), a cell that waited
    and went on would need an engine start of its own in each later run, on a GPU more than its generation."""
    offline = [r for r in rows if _offline_speculative(r)]
    room = settle_room({b: {_engine(r) for r in offline if r.get("batch_size") == b}
                        for b in {r.get("batch_size") for r in offline}})
    below = {str(r["config_hash"]) for r in offline if str(r.get("config_hash")) in among and room[r.get("batch_size")]
             and r.get("status") == "ok" and isinstance(r.get("speedup"), (int, float)) and r["speedup"] < 1.0}
    going_on = {_engine(r) for r in offline if str(r.get("config_hash")) not in below}
    return {str(r["config_hash"]) for r in offline if str(r.get("config_hash")) in below and _engine(r) not in going_on}


def later_now(planned: Sequence[PlannedCell], waiting: set[str]) -> list[PlannedCell]:
    """The cells of engine runs after the first that do not wait (their configuration not in ``waiting``),
    baselines included, in the grid's order."""
    return [p for p in planned if p.cell.engine_run > 0 and p.cell.config_hash not in waiting]


# The engines that go on measure the spread every interval rests on: a settled configuration's engines leave it.
# At equal engine deviations three speculative engines per baseline engine give 3 engine runs df 4.0 (t 2.78), six
# 5.3 (t 2.52), one 2 (t 4.30): futility keeps at least three configurations of a batch size going (or all it has),
# so the intervals of those that pay widen by about a tenth at most, not by 70%.
MIN_GOING_ON = 3


def settle_room(engines_by_batch: Mapping[Hashable, Set[Hashable]]) -> dict[Hashable, int]:
    """Per batch size, how many of its speculative engines (method and K, ``engines_by_batch``) futility may stop:
    those beyond :data:`MIN_GOING_ON` (none where it has that many or fewer: they all go on)."""
    return {batch: max(0, len(engines) - MIN_GOING_ON) for batch, engines in engines_by_batch.items()}


def settled(rows: Sequence[Mapping[str, Any]], waiting: set[str]) -> set[str]:
    """Of the ``waiting`` configurations (config hashes), those whose speedup's 95% interval lies below 1, as long
    as :data:`MIN_GOING_ON` configurations of their batch size go on.

    ``rows``: the sweep merged so far (:func:`specbench.results.merge.merge`): a waiting configuration's row has
    its one engine run and the interval the merge gives it on the spread the other configurations measured. A
    row with no such interval (no spread measured yet: every configuration waits) or not fit to be judged
    (:func:`specbench.results.schema.recommendable`) is not settled: it gets its engine runs. Where settling every
    such row would leave fewer than :data:`MIN_GOING_ON` configurations (method and K: an engine each) of a batch
    size going on, those whose interval reaches highest go on too.

    Its own interval, not the verdict's wider one over several configurations: what stopping can cost is a
    configuration that truly pays and measured below 1 by chance, which its own 95% interval allows at most
    2.5% of the time; a settled configuration can never be said to pay (its point lies below 1, so its lower
    end, however widened, does), and judged over the configurations at once, 0.84x measured once on 2 CPU
    cores would reach 1 and run every engine run for nothing.
    """
    offline = [r for r in rows if _offline_speculative(r)]
    below = {str(r["config_hash"]) for r in offline if str(r.get("config_hash")) in waiting and recommendable(r)
             and has_interval(r) and float(r["speedup_ci_high"]) < 1.0}
    done: set[str] = set()
    for batch in {r.get("batch_size") for r in offline}:
        here = [r for r in offline if r.get("batch_size") == batch]
        engines = {_engine(r) for r in here}
        going = {_engine(r) for r in here if str(r["config_hash"]) not in below}
        # Highest upper end first: the configurations nearest to straddling go on where some must.
        for row in sorted((r for r in here if str(r["config_hash"]) in below),
                          key=lambda r: -float(r["speedup_ci_high"])):
            if len(going) < min(MIN_GOING_ON, len(engines)) and _engine(row) not in going:
                going.add(_engine(row))
            elif _engine(row) not in going:
                done.add(str(row["config_hash"]))
    return done


def describe(waiting: set[str], done: set[str], later: int) -> str:
    """The sweep's line after step 3: how many configurations stopped, and how many cells are left."""
    return (f"futility: {len(done)} of {len(waiting)} configuration(s) below 1x after engine run 0 stop there "
            f"(their 95% interval lies below 1); {later} later cell(s) to run")


def _offline_speculative(row: Mapping[str, Any]) -> bool:
    return row.get("method") not in ("baseline", None) and row.get("load_request_rate") is None


def _engine(row: Mapping[str, Any]) -> tuple[Any, Any]:
    """A speculative configuration's engine, as far as a row tells it: its method and K."""
    return (row.get("method"), row.get("num_speculative_tokens"))
