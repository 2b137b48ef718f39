"""PNG charts (extra `plots`: matplotlib): a metric's trend, one report's stages.

matplotlib is imported lazily with the non-interactive Agg backend so that the core
install stays light and plotting works on headless CI runners.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from perfguard.errors import PerfguardError
from perfguard.metrics import unit


def literal(text: object) -> str:
    """`text` as matplotlib draws it literally: a `$` would start mathtext (`$\\alpha$`),
    so a case id, stage name or commit string from a file could change the label or make
    the plot raise; escaped, it is just a dollar sign."""
    return str(text).replace("$", r"\$")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise PerfguardError("plotting needs matplotlib: pip install 'perfguard[plots]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, out: str | Path) -> Path:
    """Render to memory, then write atomically: a failed or interrupted save leaves the
    previous PNG (or none), never a truncated one."""
    import io

    from perfguard.storage.jsonio import write_bytes_atomic

    fig.tight_layout()
    out = Path(out)
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=out.suffix.lstrip(".").lower() or "png")
    except ValueError as exc:  # matplotlib: "Format 'xyz' is not supported"
        raise PerfguardError(f"{out}: cannot write a plot: {exc}") from exc
    finally:
        plt.close(fig)
    write_bytes_atomic(out, buf.getvalue())
    return out


def tick_labels(commits: list[Any]) -> list[str]:
    """One label per report, none repeated: a commit measured by several reports (a rerun,
    two nightlies on one commit) gets `#2`, `#3`... after its short hash."""
    seen: dict[str, int] = {}
    out = []
    for sha in commits:
        short = str(sha or "?")[:7]
        seen[short] = seen.get(short, 0) + 1
        out.append(short if seen[short] == 1 else f"{short} #{seen[short]}")
    return out


def plot_trend(
    series: Any, changes: list[dict[str, Any]], *, case: str, metric: str, out: str | Path
) -> Path:
    """One series over its reports: the median within the run's min-max range, the
    baseline it was judged against with its bound (the band shaded), each change point as
    a dashed line with its size, and the level of each segment between change points."""
    if series.empty:
        raise PerfguardError(f"no history for case {case!r} metric {metric!r}")
    plt = _pyplot()
    x = list(range(len(series)))
    med = series["median"].astype(float)
    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=110)
    if series["min"].notna().any() and series["max"].notna().any():
        low = series["min"].fillna(med).astype(float)
        high = series["max"].fillna(med).astype(float)
        ax.fill_between(x, low, high, alpha=0.2, label="min-max of the run")
    if "baseline" in series and series["baseline"].notna().any():
        base = series["baseline"].astype(float)
        ax.step(x, base, where="mid", color="tab:gray", linewidth=1.2, label="baseline")
        if "bound" in series and series["bound"].notna().any():
            bound = series["bound"].astype(float)
            ax.fill_between(
                x, base, bound, step="mid", color="tab:gray", alpha=0.15, label="baseline band"
            )
            ax.step(
                x, bound, where="mid", color="tab:gray", linestyle=":", linewidth=1, label="bound"
            )
    ax.plot(x, med, marker="o", markersize=3, linewidth=1, label="median")
    cuts = [0, *[c["index"] for c in changes], len(series)]
    for i, (left, right) in enumerate(itertools.pairwise(cuts)):
        level = float(med.iloc[left:right].median())
        ax.hlines(
            level,
            left - 0.4,
            right - 0.6,
            colors="black",
            linewidth=1.5,
            label="level between change points" if i == 0 else None,
        )
    for c in changes:
        colour = "tab:red" if c["direction"] == "slower" else "tab:green"
        ax.axvline(c["index"] - 0.5, color=colour, linestyle="--", linewidth=1.2)
        ax.annotate(
            literal(f"{(c['ratio'] - 1) * 100:+.1f}% @ {str(c['commit'] or '?')[:8]}"),
            (c["index"] - 0.5, ax.get_ylim()[1]),
            rotation=90,
            va="top",
            ha="right",
            fontsize=8,
            color=colour,
        )
    commits = [literal(t) for t in tick_labels(list(series["commit_sha"]))]
    step = max(1, len(x) // 20)
    ax.set_xticks(x[::step], commits[::step], rotation=60, fontsize=7)
    ax.set_xlabel("commit (oldest first)")
    ax.set_ylabel(literal(f"{metric} ({unit(metric)})"))
    ax.set_title(literal(f"{case} · {metric}"))
    ax.legend(loc="upper left", fontsize=8)
    return _save(plt, fig, out)


def plot_report_stages(rows: list[dict[str, Any]], *, title: str, out: str | Path) -> Path:
    """Grouped bars per (case, stage): measured median against baseline, with the bound
    as a tick and regressions in red. `rows` have case, metric, median, baseline, bound,
    verdict."""
    if not rows:
        raise PerfguardError("the report has no stage metrics to plot")
    plt = _pyplot()
    labels = [literal(f"{r['case']}\n{r['metric'].removeprefix('stage:')}") for r in rows]
    x = range(len(rows))
    width = 0.4
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.9), 5), dpi=110)
    base = [r["baseline"] or 0 for r in rows]
    meas = [r["median"] or 0 for r in rows]
    ax.bar([i - width / 2 for i in x], base, width, label="baseline", color="tab:gray")
    colours = [
        "tab:red"
        if r["verdict"] == "regression"
        else "tab:green"
        if r["verdict"] == "improvement"
        else "tab:blue"
        for r in rows
    ]
    ax.bar([i + width / 2 for i in x], meas, width, label="measured (median)", color=colours)
    for i, r in enumerate(rows):
        if r.get("bound"):
            ax.hlines(r["bound"], i - width, i + width, colors="black", linewidth=1)
    ax.set_yscale("log")
    ax.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("ms (log scale); black tick = bound")
    ax.set_title(literal(title))
    ax.legend(fontsize=8)
    return _save(plt, fig, out)
