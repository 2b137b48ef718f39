"""Terminal tables (rich) of what the commands return: results, calibrations, A/B runs.

Every value that came from a file or a case id is escaped before it reaches rich markup,
its control characters shown (`perfguard.presentation.escape.rich_markup`: an ESC from a
file cannot start a terminal sequence).
Reports have their own renderings: the table in `perfguard.presentation.render`, the
Markdown in `perfguard.presentation.markdown`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rich.table import Table

from perfguard.metrics import unit
from perfguard.presentation.escape import rich_markup as escape
from perfguard.storage.cases import Case

if TYPE_CHECKING:
    from perfguard.decision.calibrate import CaseCalibration
    from perfguard.decision.changes import BaselineDiff
    from perfguard.measurement.ab import ABResult
    from perfguard.results import Results
    from perfguard.storage.baseline import Baseline


def results_table(results: Results) -> Table:
    """`perfguard run`: one row per case, the medians that matter most."""
    table = Table(title=escape(f"results ({results.platform} / {results.hardware})"))
    for col in ("case", "status", "e2e", "DenoisingStage", "peak memory", "n", "output"):
        table.add_column(col, justify="left" if col in ("case", "status", "output") else "right")
    for cid, res in sorted(results.cases.items()):

        def med(metric: str, samples: dict[str, list[float]] = res.samples) -> str:
            values = sorted(samples.get(metric, []))
            return f"{values[len(values) // 2]:.3f} {unit(metric)}" if values else "-"

        status = res.status if res.status == "ok" else f"error: {res.error}"
        table.add_row(
            escape(cid),
            escape(status),
            med("e2e"),
            med("stage:DenoisingStage"),
            med("peak_memory"),
            str(res.repeats),
            escape(res.output_hash or "-"),
        )
    return table


def calibration_table(cal: CaseCalibration, runs: int) -> Table:
    """`perfguard calibrate`: one case's noise and detection figures, per metric."""

    def pct(x: float | None) -> str:
        return "not caught" if x is None else f"+{x:.0%}"

    s = cal.setup
    table = Table(
        title=escape(
            f"{cal.case_id}: {runs} processes x {s.repeats} runs; checks of {s.check_processes} "
            f"process(es) x {s.repeats} runs vs a baseline of {s.baseline_processes}, "
            f"<= {s.max_reruns} re-runs in fresh processes"
            f", alpha {s.rule.alpha:g}"
            f"{', timings normalized' if cal.timing == 'normalized' else ''}"
        )
    )
    for col in (
        "metric",
        "median",
        "within",
        "between",
        "band (rel/abs)",
        "false alarms",
        "catches (95 %)",
        "suggested band",
        "false alarms ",
        "catches (95 %) ",
    ):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for d in cal.detections:
        n = d.noise
        table.add_row(
            escape(n.metric),
            f"{n.median:.3f} ms",
            f"{n.within:.1%}",
            f"{n.between:.1%}",
            f"{d.band.rel:g} / {d.band.abs:g}",
            f"{d.false_alarm:.1%}",
            pct(d.catches) if d.false_alarm <= 0.01 else "(too many alarms)",
            f"{d.suggested.rel:g} / {d.suggested.abs:g}",
            f"{d.suggested_false_alarm:.1%}",
            pct(d.suggested_catches),
        )
    return table


def environment_table(fingerprint: Mapping[str, Any]) -> Table:
    """`perfguard env`: the fingerprint stored with baselines and reports."""
    table = Table(title="perfguard environment", show_header=False)
    for key, value in fingerprint.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
        elif isinstance(value, list):
            value = "; ".join(map(str, value)) or "-"
        table.add_row(escape(key), escape(str(value)))
    return table


def cases_table(cases: list[Case], platform: str) -> Table:
    """`perfguard list-cases`: the selected cases and the file each came from.

    A built-in case has a `preset`, a diffusers case a `model` directory: each has its
    own column (`-` where it does not apply), so a path never reads as a preset name.
    """
    table = Table(title=f"cases for {platform} ({len(cases)})")
    columns = ("id", "workload", "preset", "model", "size", "steps", "batch", "devices")
    for col in (*columns, "tags", "file"):
        table.add_column(col)
    for c in cases:
        table.add_row(
            escape(c.id),
            escape(c.workload),
            escape(c.preset or "-"),
            escape(c.model or "-"),
            f"{c.width}x{c.height}",
            str(c.steps),
            str(c.batch),
            str(c.num_devices),
            escape(",".join(c.tags)),
            escape(c.source),
        )
    return table


def ab_table(result: ABResult, pairs: int) -> Table:
    """`perfguard ab`: per metric the two medians, B/A with its interval, the p-value."""

    def fmt(v: Mapping[str, Any]) -> str:
        return ",".join(f"{k}={x}" for k, x in v.items()) or "(case as is)"

    a, b = fmt(result.variant_a), fmt(result.variant_b)
    table = Table(title=escape(f"A/B {result.case_id}: A[{a}] vs B[{b}], {pairs} pairs ABBA"))
    for col in ("metric", "A median", "B median", "B/A", "99% bounds", "answer"):
        table.add_column(col, justify="left" if col in ("metric", "answer") else "right")
    for comp in result.comparisons():
        u = unit(comp.metric)
        caught = comp.answer.detectable
        table.add_row(
            escape(comp.metric),
            f"{comp.median_a:.3f} {u}",
            f"{comp.median_b:.3f} {u}",
            f"{comp.estimate.ratio:.3f}",
            f"[{comp.estimate.low:.3f}, {comp.estimate.high:.3f}]",
            comp.answer.label + ("" if caught is None else f" (catches +{caught:.0%})"),
        )
    return table


def baseline_tables(baseline: Baseline, case_ids: list[str]) -> list[Table]:
    """`perfguard baselines show`: the tolerance profiles, then one table per scenario."""
    from perfguard.metrics import METRIC_CLASSES, WORK_KINDS

    b = baseline
    prof = Table(title="tolerance profiles (rel / abs)")
    prof.add_column("class")
    names = sorted(b.profiles)
    for name in names:
        prof.add_column(escape(name + (" (advisory)" if b.profiles[name].advisory else "")))
    for cls in METRIC_CLASSES:
        prof.add_row(
            cls, *(f"{b.profiles[n].rel[cls]:g} / {b.profiles[n].abs[cls]:g}" for n in names)
        )
    for kind in WORK_KINDS:  # work counters: exact (0 / 0) unless a profile says otherwise
        prof.add_row(
            kind,
            *(
                f"{b.profiles[n].rel.get(kind, 0.0):g} / {b.profiles[n].abs.get(kind, 0.0):g}"
                for n in names
            ),
        )
    tables = [prof]

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    for cid in case_ids:
        s = b.scenarios[cid]
        table = Table(title=escape(cid + (f" — {s.notes}" if s.notes else "")))
        for col in ("metric", "median", "n", "iqr", "min", "max", "override"):
            table.add_column(col, justify="left" if col in ("metric", "override") else "right")
        for metric, summ in s.metrics.items():
            ov = s.tolerance_overrides.get(metric)
            table.add_row(
                escape(metric),
                f(summ.median),
                str(summ.n),
                f(summ.iqr),
                f(summ.min),
                f(summ.max),
                escape(json.dumps(ov)) if ov else "",
            )
        table.caption = escape(resolution_caption(b, s))
        tables.append(table)
        if s.work is not None:
            tables.append(_work_table(cid, s))
    return tables


def resolution_caption(baseline: Baseline, scenario: Any) -> str:
    """What a default check against `scenario` resolves per timed class, and which classes
    it judges in full (`perfguard.decision.resolution`; computed for older files)."""
    from perfguard.decision.resolution import of_scenario, resolvable
    from perfguard.decision.tolerances import DEFAULT_PROFILE
    from perfguard.metrics import TIMED_CLASSES

    if DEFAULT_PROFILE not in baseline.profiles:
        return ""
    profile = baseline.profile(DEFAULT_PROFILE)
    found = scenario.resolution or of_scenario(scenario, profile)
    if not found:
        return "resolution: no timed figure with a spread"
    parts = []
    for cls in TIMED_CLASSES:
        if cls in found:
            full = resolvable(found[cls], float(profile.rel[cls]))
            parts.append(f"{cls} +{found[cls]:.0%}{'' if full else ' (below: slower only)'}")
    return "a check resolves " + ", ".join(parts)


def _work_table(cid: str, s: Any) -> Table:
    """A scenario's work counters: one row per stage (and the run), min..max where varied."""
    from perfguard.metrics import WORK_KINDS, work_metric

    w = s.work
    ctx = ", ".join(f"{k} {v}" for k, v in sorted(w.context.items()))
    table = Table(title=escape(f"{cid}: work counters ({ctx}; {w.runs} counted run(s))"))
    table.add_column("stage")
    for kind in WORK_KINDS:
        table.add_column(kind, justify="right")
    stages = sorted({m.split(":", 1)[1] for m in w.counters if ":" in m})

    def cell(metric: str) -> str:
        pair = w.counters.get(metric)
        if pair is None:
            return "-"
        return f"{pair[0]:,}" if pair[0] == pair[1] else f"{pair[0]:,}..{pair[1]:,}"

    for stage in stages:
        table.add_row(escape(stage), *(cell(work_metric(k, stage)) for k in WORK_KINDS))
    table.add_row("(per step, heaviest)", *(cell(work_metric(k, step=True)) for k in WORK_KINDS))
    table.add_row("(run)", *(cell(work_metric(k)) for k in WORK_KINDS))
    return table


def baseline_diff_table(d: BaselineDiff, old_label: str, new_label: str) -> Table:
    """`perfguard baselines diff`: each changed figure with its interval and verdict."""
    table = Table(title=escape(f"{old_label} -> {new_label}"))
    for col in ("case", "metric", "old", "new", "new/old", f"{d.confidence:.0%} interval"):
        table.add_column(col, justify="left" if col in ("case", "metric") else "right")
    table.add_column("change")
    styles = {"slower": "red", "faster": "green"}
    for row in d.changed:
        ratio = row.ratio
        interval = "-" if row.low is None or row.high is None else f"{row.low:.3f}-{row.high:.3f}"
        change = row.change or "-"
        table.add_row(
            escape(row.case_id),
            escape(row.metric),
            "-" if row.old is None else f"{row.old:.3f}",
            "-" if row.new is None else f"{row.new:.3f}",
            "-" if ratio is None else f"{ratio:.3f}",
            interval,
            f"[{styles[change]}]{change}[/]" if change in styles else change,
        )
    return table


def history_table(frame: Any, title: str) -> Table:
    """`perfguard history show`: one row per report, case and metric (a DataFrame), with the
    hardware (a series is per hardware) and any fault injection the report was made with."""
    table = Table(title=escape(title))
    cols = ("date", "commit", "hardware", "case", "metric", "n", "median", "iqr", "baseline")
    right = ("n", "median", "iqr", "baseline", "ratio")
    for col in (*cols, "ratio", "verdict"):
        table.add_column(col, justify="right" if col in right else "left")

    def cell(value: Any, digits: int = 3) -> str:
        if value is None or (isinstance(value, float) and value != value):
            return "-"
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    for r in frame.itertuples(index=False):
        verdict = cell(r.verdict)
        inject = getattr(r, "inject", None)
        if isinstance(inject, str) and inject:
            verdict += f" (injected {inject})"
        table.add_row(
            escape(str(r.date)[:19]),
            escape(str(r.commit_sha or "-")[:10]),
            escape(str(r.hardware or "-")),
            escape(str(r.case)),
            escape(str(r.metric)),
            cell(r.n),
            cell(r.median),
            cell(r.iqr),
            cell(r.baseline),
            cell(r.ratio, 4),
            escape(verdict),
        )
    return table


def changes_table(found: list[dict[str, Any]]) -> Table:
    """`perfguard history changes`: each change point, its commit, size and direction."""
    table = Table(title=f"{len(found)} change point(s)")
    for col in ("hardware", "case", "metric", "commit", "date", "before", "after", "change"):
        table.add_column(col)
    for c in found:
        table.add_row(
            escape(str(c.get("hardware") or "-")),
            escape(c["case"]),
            escape(c["metric"]),
            escape(str(c["commit"] or "-")[:10]),
            escape(str(c["date"])[:19]),
            f"{c['before']:.3f}",
            f"{c['after']:.3f}",
            f"{(c['ratio'] - 1) * 100:+.1f}% {c['direction']}",
        )
    return table
