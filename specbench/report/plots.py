"""The report's figures: seaborn on matplotlib, rendered to embedded PNG data URIs.

Each public function takes the results frame (:func:`tables.load_frame`) and
returns a :class:`Plot`: an image, or a sentence saying why there is none.
Figures are built as ``matplotlib.figure.Figure`` objects drawn on the Agg
canvas, not through ``pyplot``, and styles are applied in a context, so
building a report changes no global state of the process that called it (the
sweep's launcher, for one).

Colours follow seaborn's colour-blind-safe palette, one colour per method
variant (the method and its own keys: ``controlled alpha=0.6``, :data:`VARIANT`),
and markers tell K apart; both mappings are fixed per report so that a variant
has the same colour in every figure. A series is one ``method_label``
(:data:`CONFIG`): cells that differ in a method's own keys are never drawn as one.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, NullLocator

from specbench.analytic import acceptance, verdicts
from specbench.report.tables import (
    CONFIG,
    PANEL,
    PREDICTED,
    PREDICTED_DECODE,
    VARIANT,
    acceptance_gaps,
    compared,
    grid_of,
    has_predictions,
    measured,
    records,
    speculative,
)

DPI = 110
_PANEL_W, _PANEL_H = 4.4, 3.3  # inches per facet
_MIN_WIDTH = 6.4  # inches: room for a one-facet figure's legend
_MAX_COLS = 3
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">")
_BASELINE_COLOUR = "#4d4d4d"


@dataclass(frozen=True)
class Plot:
    """One figure section of the page."""

    anchor: str  # HTML id
    title: str
    caption: str  # one sentence: what to look for
    image: str | None = None  # data:image/png;base64,...
    missing: str | None = None  # why there is no image
    notes: list[str] = field(default_factory=list)  # what the image leaves out, and why


@dataclass(frozen=True)
class Encoding:
    """Colour per method variant and marker per K, shared by every figure of one report."""

    colours: dict[str, tuple[float, float, float] | str]
    markers: dict[int, str]

    @classmethod
    def for_frame(cls, df: pd.DataFrame) -> Encoding:
        """Assign colours to the method variants and markers to the Ks found in ``df``."""
        variants = sorted(v for v in df[VARIANT].dropna().unique() if v != "baseline")
        palette = sns.color_palette("colorblind", max(len(variants), 1))
        colours: dict[str, tuple[float, float, float] | str] = dict(zip(variants, palette))
        colours["baseline"] = _BASELINE_COLOUR
        ks = sorted(int(k) for k in df["num_speculative_tokens"].dropna().unique() if k > 0)
        return cls(colours, {k: _MARKERS[i % len(_MARKERS)] for i, k in enumerate(ks)})

    def colour(self, variant: str) -> tuple[float, float, float] | str:
        """The method variant's colour."""
        return self.colours.get(variant, _BASELINE_COLOUR)

    def marker(self, k: int) -> str:
        """The marker for K."""
        return self.markers.get(k, "o")

    def legend(self, variants: Sequence[str], ks: Sequence[int]) -> list[Line2D]:
        """Legend handles: a coloured line per method variant, a grey marker per K."""
        handles = [Line2D([], [], color=self.colour(v), lw=2, label=v) for v in variants]
        handles += [
            Line2D([], [], color="0.35", marker=self.marker(k), ls="none", label=f"K={k}")
            for k in ks
            if k > 0
        ]
        return handles


@contextmanager
def _style() -> Iterator[None]:
    # Contexts instead of sns.set_theme(): the caller's rcParams stay as they were.
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.85):
        yield


def _text(value: object) -> str:
    # Two "$" in a workload or method name would switch matplotlib to mathtext, which may fail to parse.
    return str(value).replace("$", r"\$")


def _facets(panels: Sequence[str], *, sharey: bool = True) -> tuple[Figure, list[Axes]]:
    """One axes per panel, wrapped at three columns; unused axes are removed."""
    cols = min(len(panels), _MAX_COLS)
    rows = math.ceil(len(panels) / cols)
    width = max(_PANEL_W * cols, _MIN_WIDTH)
    fig = Figure(figsize=(width, _PANEL_H * rows), layout="constrained")
    grid = fig.subplots(rows, cols, squeeze=False, sharey=sharey)
    axes = list(grid.flat)
    for ax in axes[len(panels) :]:
        fig.delaxes(ax)
    for ax, panel in zip(axes, panels):
        ax.set_title(_text(panel))
    return fig, axes[: len(panels)]


def _legend(fig: Figure, handles: list[Line2D]) -> None:
    """A figure legend below the axes, in as many columns as fit the figure's width."""
    labels = [_text(h.get_label()) for h in handles]
    # An entry is its key (~0.45 in) plus its text (~0.075 in per character at this font size).
    entry = 0.45 + 0.075 * max(len(label) for label in labels)
    width, height = fig.get_size_inches()
    cols = max(1, min(len(handles), int(width // entry)))
    rows = math.ceil(len(handles) / cols)
    # The constrained layout takes the legend's room from the axes; give it back.
    fig.set_size_inches(width, height + 0.25 * rows + 0.1)
    fig.legend(handles=handles, labels=labels, loc="outside lower center", ncols=cols, frameon=False)


def _log2_batches(ax: Axes, batches: Sequence[int]) -> None:
    """Log-2 x axis with a labelled tick at each measured batch size."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(int(b) for b in batches))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(b) for b in ticks])
    # Room either side so that the outermost points and their bars are not clipped.
    ax.set_xlim(ticks[0] / 1.6, ticks[-1] * 1.6)
    ax.set_xlabel("batch size")


def _png(fig: Figure) -> str:
    # An Agg canvas of its own: no pyplot, so no backend is chosen for the whole process.
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    # No "Software" text chunk: it carries a URL, and the page must hold none.
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _without(plot: Plot, reason: str) -> Plot:
    return replace(plot, missing=reason)


def _series(df: pd.DataFrame) -> Iterator[tuple[str, str, int, pd.DataFrame]]:
    """(method_label, method variant, K, rows sorted by batch size) for each configuration in ``df``."""
    # The label names the series; method, variant and K before it keep K in numeric order.
    for (_, variant, k, label), rows in df.groupby(["method", VARIANT, "num_speculative_tokens", CONFIG], sort=True):
        yield str(label), str(variant), int(k), rows.sort_values("batch_size")


def _panels(df: pd.DataFrame) -> list[str]:
    return sorted(df[PANEL].unique())


def _ks(df: pd.DataFrame) -> list[int]:
    return sorted(int(k) for k in df["num_speculative_tokens"].unique())


# --- headline: speedup vs batch size --------------------------------------------------------------


def speedup_vs_batch(df: pd.DataFrame, enc: Encoding) -> Plot:
    """Measured speedup against batch size per method and K, with CIs, the model's curve and 1×."""
    plot = Plot(
        anchor="speedup",
        title="Speedup against batch size",
        caption=(
            "Speedup over plain decoding at the same batch size. Filled markers: wall time (prefill "
            "included), with confidence-interval bars; hollow markers: decode only (first to last "
            "token of each request), the part speculation acts on. Each has its model line (dashed: "
            "wall, dash-dot: decode; a bar marks the prediction at each batch size); prefill, which "
            "speculation does not speed up, pulls the wall speedup toward 1×. Look for where each "
            "curve crosses the dotted 1× line, past which speculation costs more than it saves."
        ),
    )
    comp = compared(df)
    if comp.empty:
        return _without(plot, "No speedups to plot: no speculative cell was compared with a baseline.")
    notes = []
    has_model = has_predictions(comp)
    if not has_model:
        notes.append(
            "The model's predicted curve is not drawn: this results file has no predicted_speedup values."
        )
    with _style():
        fig, axes = _facets(_panels(comp))
        for ax, panel in zip(axes, _panels(comp)):
            rows = comp[comp[PANEL] == panel]
            series = list(_series(rows))
            for i, (_, variant, k, s) in enumerate(series):
                batches = s["batch_size"].astype(float).to_numpy()
                # Nudge series apart along x so that overlapping CI bars stay readable.
                nudge = 2 ** ((i - (len(series) - 1) / 2) * 0.07)
                x = batches * nudge
                y = s["speedup"].to_numpy(dtype=float)
                low = (y - s["speedup_ci_low"].to_numpy(dtype=float, na_value=np.nan)).clip(min=0)
                high = (s["speedup_ci_high"].to_numpy(dtype=float, na_value=np.nan) - y).clip(min=0)
                ax.errorbar(
                    x, y, yerr=np.nan_to_num([low, high]), color=enc.colour(variant), marker=enc.marker(k),
                    ms=6, lw=1.6, capsize=3, elinewidth=1,
                )
                if "decode_speedup" in s:
                    ax.plot(x, s["decode_speedup"].to_numpy(dtype=float, na_value=np.nan),
                            color=enc.colour(variant), marker=enc.marker(k), mfc="none", ms=6, ls="none")
                if has_model:
                    model = s.dropna(subset=[PREDICTED])
                    ax.plot(
                        model["batch_size"].astype(float) * nudge, model[PREDICTED].astype(float),
                        color=enc.colour(variant), ls="--", lw=1.3, alpha=0.9, marker="_", ms=14, mew=1.6,
                    )
                if PREDICTED_DECODE in s:
                    model = s.dropna(subset=[PREDICTED_DECODE])
                    ax.plot(
                        model["batch_size"].astype(float) * nudge, model[PREDICTED_DECODE].astype(float),
                        color=enc.colour(variant), ls="-.", lw=1.0, alpha=0.8, marker="_", ms=10, mew=1.0,
                    )
            ax.axhline(1.0, color="0.2", ls=":", lw=1.3)
            _log2_batches(ax, rows["batch_size"].astype(int))
        axes[0].set_ylabel("speedup (× plain decoding)")
        handles = enc.legend(sorted(comp[VARIANT].unique()), _ks(comp))
        handles.append(Line2D([], [], color="0.2", ls=":", label="1× (break-even)"))
        if "decode_speedup" in comp:
            handles.append(Line2D([], [], color="0.35", marker="o", mfc="none", ls="none", label="decode only"))
        if has_model:
            handles.append(Line2D([], [], color="0.35", ls="--", marker="_", ms=14, label="model, wall time"))
        if PREDICTED_DECODE in comp and comp[PREDICTED_DECODE].notna().any():
            handles.append(Line2D([], [], color="0.35", ls="-.", marker="_", ms=10, label="model, decode"))
        _legend(fig, handles)
        return replace(plot, image=_png(fig), notes=notes)


# --- acceptance length vs K -----------------------------------------------------------------------


def acceptance_vs_k(df: pd.DataFrame, enc: Encoding) -> Plot:
    """Measured acceptance length (and tokens per pass) against K, with E(alpha, K) for the fitted alpha."""
    plot = Plot(
        anchor="acceptance",
        title="Acceptance length against K",
        caption=(
            "Filled points are acceptance length, 1 + accepted / drafts: tokens per target pass over the "
            "passes that carried a draft (vLLM's definition), counting only accepted tokens that reached "
            "the output: vLLM's own counters also count drafts accepted past max_tokens or a stop token "
            "(cells where the two differ by more than 2% are listed below). Hollow points are output "
            "tokens per target pass over every pass, each request's prefill pass (one token, no draft) and passes without a "
            "draft included: what the wall time pays for. Each line is E(α, K), the tokens per pass a full "
            "K-token draft on every pass gives at the method's median fitted α. Points below their line "
            "mean acceptance decays faster than a constant α, or (ngram) drafts shorter than K; a gap "
            "between filled and hollow points means many passes carried no draft, or prompts were long "
            "next to the output."
        ),
    )
    spec = speculative(df)
    spec = spec[spec["acceptance_length"].notna()]
    if spec.empty:
        return _without(plot, "No acceptance lengths to plot: no speculative cell ran to the end.")
    notes = acceptance_gaps(df)
    with _style():
        fig, axes = _facets(_panels(spec))
        for ax, panel in zip(axes, _panels(spec)):
            rows = spec[spec[PANEL] == panel]
            variants = sorted(rows[VARIANT].unique())
            max_k = int(rows["num_speculative_tokens"].max())
            for j, variant in enumerate(variants):
                own = rows[rows[VARIANT] == variant]
                colour = enc.colour(variant)
                # Variants side by side at each K so their points do not cover each other.
                x = own["num_speculative_tokens"].astype(float) + (j - (len(variants) - 1) / 2) * 0.12
                ax.scatter(x, own["acceptance_length"].astype(float), color=colour, s=36, zorder=3)
                per_pass = own["tokens_per_pass"].astype(float)
                ax.scatter(x, per_pass, facecolors="none", edgecolors=colour, s=36, lw=1.3, zorder=3)
                alphas = own["alpha"].dropna().astype(float)
                if alphas.empty:
                    notes.append(f"{panel}, {variant}: no fitted α, so no E(α, K) line.")
                    continue
                alpha = float(alphas.median())
                ks = np.arange(1, max_k + 1)
                expected = [acceptance.expected_tokens_per_pass(alpha, int(k)) for k in ks]
                ax.plot(ks, expected, color=colour, lw=1.4)
                # Right of the last K's points, so the label never sits on one.
                ax.text(
                    max_k + 0.3, expected[-1], f"α={alpha:.2f}", color=colour, fontsize=8, va="center",
                )
            ax.set_xticks(range(1, max_k + 1))
            ax.set_xlim(0.5, max_k + 1.1)
            ax.set_xlabel("K (num_speculative_tokens)")
        axes[0].set_ylabel("tokens per target pass")
        handles = enc.legend(sorted(spec[VARIANT].unique()), [])
        handles += [
            Line2D([], [], color="0.35", marker="o", ls="none", label="acceptance length (drafted steps)"),
            Line2D(
                [], [], color="0.35", marker="o", mfc="none", ls="none", label="tokens per pass (all steps)"
            ),
            Line2D([], [], color="0.35", lw=1.4, label="E(α, K)"),
        ]
        _legend(fig, handles)
        return replace(plot, image=_png(fig), notes=notes)


# --- per-position acceptance ----------------------------------------------------------------------


def acceptance_per_position(df: pd.DataFrame, enc: Encoding) -> Plot:
    """Acceptance rate by draft position per method and K, at batch 1 or the smallest batch measured."""
    plot = Plot(
        anchor="per-position",
        title="Acceptance rate by draft position",
        caption=(
            "The share of drafts whose token at each position was accepted (position i counts only if "
            "every earlier one was): look for how fast it falls, since draft tokens past a steep drop "
            "are mostly wasted work."
        ),
    )
    spec = speculative(df)
    if spec.empty:
        return _without(plot, "No per-position acceptance rates to plot: no speculative cell ran to the end.")
    spec = spec[[rates is not None and len(rates) > 0 for rates in spec["acceptance_rate_per_pos"]]]
    if spec.empty:
        return _without(
            plot,
            "No per-position acceptance rates to plot: no speculative cell proposed a draft "
            "(every acceptance_rate_per_pos is empty).",
        )
    notes = []
    with _style():
        fig, axes = _facets(_panels(spec))
        for ax, panel in zip(axes, _panels(spec)):
            rows = spec[spec[PANEL] == panel]
            for label, variant, k, s in _series(rows):
                batch = int(s["batch_size"].min())
                if batch != 1:
                    notes.append(f"{panel}, {label}: batch 1 not measured; batch {batch} shown.")
                at_batch = s.loc[s["batch_size"] == batch, "acceptance_rate_per_pos"]
                rates = [np.asarray(r, dtype=float) for r in at_batch]
                width = max(len(r) for r in rates)
                # Several rows share a configuration when the sweep varied another setting
                # (engine options, prompt counts): their rates are averaged.
                padded = [np.pad(r, (0, width - len(r)), constant_values=np.nan) for r in rates]
                ax.plot(
                    np.arange(1, width + 1), np.nanmean(padded, axis=0),
                    color=enc.colour(variant), marker=enc.marker(k), lw=1.5, ms=6,
                )
            width = max(len(r) for r in rows["acceptance_rate_per_pos"])
            ax.set_xticks(range(1, width + 1))
            ax.set_xlim(0.7, width + 0.3)
            ax.set_ylim(0, 1.02)
            ax.set_xlabel("draft position")
        axes[0].set_ylabel("acceptance rate")
        _legend(fig, enc.legend(sorted(spec[VARIANT].unique()), _ks(spec)))
        return replace(plot, image=_png(fig), notes=notes)


# --- heatmap at the smallest batch ----------------------------------------------------------------


def speedup_heatmap(df: pd.DataFrame, enc: Encoding) -> Plot:
    """Speedup at batch 1 (or the smallest batch compared) by method+K and workload, values annotated."""
    plot = Plot(
        anchor="heatmap",
        title="Speedup at the smallest batch size",
        caption=(
            "Speedup by configuration and workload where speculation has its best chance, the smallest "
            "batch: look for the row that is blue across every workload, and for workloads where nothing is."
        ),
    )
    comp = compared(df)
    if comp.empty:
        return _without(plot, "No speedups to map: no speculative cell was compared with a baseline.")
    batch = int(comp["batch_size"].min())
    notes = [] if batch == 1 else [
        f"Batch 1 was not measured; batch {batch}, the smallest compared, is shown."
    ]
    at = comp[comp["batch_size"] == batch]
    order = at.sort_values(["method", VARIANT, "num_speculative_tokens"])[CONFIG].drop_duplicates().tolist()
    grid = at.pivot_table(index=CONFIG, columns=PANEL, values="speedup", aggfunc="median").reindex(order)
    if grid.isna().any().any():
        notes.append("Blank squares: configuration not measured, or not compared, on that workload.")
    with _style():
        width = max(4.5, 1.5 * grid.shape[1] + 2.8)
        fig = Figure(figsize=(width, max(2.4, 0.5 * grid.shape[0] + 1.4)), layout="constrained")
        ax = fig.subplots()
        # Speedups are ratios: a log scale symmetric about 1x gives 0.5x and 2x equal weight.
        values = grid.to_numpy(dtype=float)
        reach = max(float(np.nanmax(values)), 1 / max(float(np.nanmin(values)), 1e-3), 1.1)
        sns.heatmap(
            grid.astype(float), ax=ax, annot=True, fmt=".2f", cmap="vlag_r", norm=LogNorm(1 / reach, reach),
            linewidths=0.5, linecolor="white", cbar_kws={"label": "speedup (× plain decoding)"},
        )
        colourbar = ax.collections[0].colorbar
        ticks = [t for t in (0.25, 0.5, 0.67, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0) if 1 / reach <= t <= reach]
        colourbar.set_ticks(ticks, labels=[f"{t:g}×" for t in ticks])
        colourbar.ax.minorticks_off()
        ax.set_xticklabels([_text(t.get_text()) for t in ax.get_xticklabels()], rotation=0)
        ax.set_yticklabels([_text(t.get_text()) for t in ax.get_yticklabels()], rotation=0)
        ax.set_xlabel("workload")
        ax.set_ylabel("")
        ax.set_title(f"batch size {batch}")
        return replace(plot, image=_png(fig), notes=notes)


# --- time per output token ------------------------------------------------------------------------


def tpot_vs_batch(df: pd.DataFrame, enc: Encoding) -> Plot:
    """Median time per output token against batch size per method and K, with a band to the p90."""
    plot = Plot(
        anchor="tpot",
        title="Time per output token against batch size",
        caption=(
            "Median time per output token (line) with a band up to the 90th percentile: look for where "
            "a speculative line rises above the grey baseline, where speculation makes each token slower."
        ),
    )
    ok = measured(df)
    ok = ok[ok["tpot_s_p50"].notna()]
    if ok.empty:
        reasons = sorted({str(n) for n in measured(df)["latency_note"].dropna()})
        why = f" ({'; '.join(reasons)})" if reasons else ""
        return _without(
            plot, f"No time-per-output-token figures: no cell recorded per-request latencies{why}."
        )
    notes = []
    if ok["tpot_s_p90"].isna().any():
        notes.append("Some cells have no 90th percentile: no band is drawn at those points.")
    with _style():
        fig, axes = _facets(_panels(ok))
        for ax, panel in zip(axes, _panels(ok)):
            rows = ok[ok[PANEL] == panel]
            for _, variant, k, s in _series(rows):
                colour = enc.colour(variant)
                x = s["batch_size"].astype(float).to_numpy()
                p50 = 1000 * s["tpot_s_p50"].astype(float).to_numpy()
                p90 = 1000 * s["tpot_s_p90"].to_numpy(dtype=float, na_value=np.nan)
                ax.plot(x, p50, color=colour, marker=enc.marker(k), lw=2.2 if k == 0 else 1.5, ms=5)
                if len(x) > 1:
                    ax.fill_between(x, p50, np.where(np.isnan(p90), p50, p90), color=colour, alpha=0.15, lw=0)
                else:
                    ax.vlines(x, p50, np.where(np.isnan(p90), p50, p90), color=colour, alpha=0.4, lw=4)
            _log2_batches(ax, rows["batch_size"].astype(int))
        # Once all panels are drawn: set_ylim freezes the shared upper limit at the data seen so far.
        axes[0].set_ylim(bottom=0)
        axes[0].set_ylabel("time per output token (ms)")
        variants = sorted(ok[VARIANT].unique(), key=lambda v: (v != "baseline", v))
        _legend(fig, enc.legend(variants, _ks(ok)))
        return replace(plot, image=_png(fig), notes=notes)


# --- temperature ----------------------------------------------------------------------------------

_TEMPERATURE_METRICS = (("acceptance_length", "acceptance length"), ("tokens_per_pass", "tokens per pass"),
                        ("speedup", "speedup"))


def versus_temperature(df: pd.DataFrame, enc: Encoding) -> Plot:
    """Acceptance length, tokens per pass and speedup against temperature per method, batch size and
    workload, with a verdict per configuration: the temperature at which it stops paying."""
    plot = Plot(
        anchor="temperature",
        title="Acceptance and speedup against temperature",
        caption=(
            "Acceptance length, tokens per pass and speedup at each temperature (0: greedy), one line per "
            "method and batch size: look for where acceptance falls as the target's distribution flattens, "
            "and where the speedup line crosses 1×."
        ),
    )
    spec = speculative(df)
    spec = spec.assign(temperature=spec["temperature"].astype(float).fillna(0.0))
    if spec["temperature"].nunique() < 2:
        return _without(plot, "No temperature axis: every cell was measured at one temperature.")
    workloads = sorted(spec["workload"].dropna().unique())
    panels = [f"{w}: {label}" for w in workloads for _, label in _TEMPERATURE_METRICS]
    styles = ("-", "--", ":", "-.")
    batches = sorted(int(b) for b in spec["batch_size"].unique())
    with _style():
        fig, axes = _facets(panels, sharey=False)
        for i, workload in enumerate(workloads):
            rows = spec[spec["workload"] == workload]
            for j, (column, label) in enumerate(_TEMPERATURE_METRICS):
                ax = axes[i * len(_TEMPERATURE_METRICS) + j]
                for (variant, k, config, batch), s in rows.groupby([VARIANT, "num_speculative_tokens", CONFIG,
                                                                     "batch_size"], sort=True):
                    s = s.sort_values("temperature")
                    ax.plot(s["temperature"], s[column].astype(float), color=enc.colour(str(variant)),
                            marker=enc.marker(int(k)), ls=styles[batches.index(int(batch)) % len(styles)], ms=5)
                if column == "speedup":
                    ax.axhline(1.0, color=_BASELINE_COLOUR, lw=1, ls="--")
                ax.set_xlabel("temperature")
                ax.set_ylabel(label)
        variants = sorted(spec[VARIANT].unique())
        handles = enc.legend(variants, _ks(spec)) + [
            Line2D([], [], color="0.35", ls=styles[i % len(styles)], label=f"batch {b}") for i, b in enumerate(batches)]
        _legend(fig, handles)
        return replace(plot, image=_png(fig), notes=temperature_verdicts(df))


def temperature_verdicts(df: pd.DataFrame) -> list[str]:
    """Per method configuration, workload and batch size planned at several temperatures, in words: how far
    it pays from the lowest temperature up, and the first temperature not judged (failed, flagged,
    mismatched, never measured), named. The decision is
    :func:`specbench.analytic.verdicts.temperature_verdicts`'."""
    lines = []
    for decided in verdicts.temperature_verdicts(records(df), grid_of(df)):
        line = f"{decided.config} on {decided.workload} at batch {decided.batch}: "
        reached = decided.reached
        if len(reached) == len(decided.planned):
            line += f"pays at every temperature measured ({', '.join(f'{t:g}' for t in reached)})"
        elif reached:
            line += f"pays up to temperature {reached[-1]:g}"
        elif decided.loss is not None:
            line += f"does not pay at temperature {decided.planned[0]:g}, the lowest"
        else:
            line += "no verdict"
        if decided.loss is not None and reached:
            line += f", stops paying at {float(decided.loss.get('temperature') or 0.0):g}"
        if decided.stop is not None:
            stop = decided.stop
            rest = ", ".join(f"{t:g}" for t in stop.unclaimed)
            line += (f"{'; ' if reached or decided.loss is not None else ': '}temperature {stop.at:g} not judged "
                     f"({stop.why})" + (f", {rest} not claimed" if rest else ""))
        lines.append(line)
    return lines


FIGURES = (speedup_vs_batch, acceptance_vs_k, acceptance_per_position, speedup_heatmap, tpot_vs_batch,
           versus_temperature)
"""Every figure of the report, in page order; each takes the frame and the report's Encoding."""
