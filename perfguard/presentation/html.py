"""HTML pages: a check report as one self-contained page with a forest plot per case.

`perfguard report render report.json --format html` writes one file a reviewer opens
from a CI artifact: the verdict, then per case a forest plot (each metric's ratio to its
baseline as a point with its confidence interval, over its tolerance band, regressions in
red) and the same figures as a table. The published history site (`site.py`) uses the same
page for each archived report, with the scripts shared between pages instead of inlined.

Why a forest plot: the verdict is a statement about a ratio and how sure the gate is of
it, so the picture shows exactly that, on a linear ratio axis where +17 % is 1.17. Bars of
absolute times on a log scale (the PNG `report plot` draws) make a 17 % step a sliver.

Why plotly: its JavaScript ships in the `plotly` wheel (`package_data/plotly.min.js`), so
the pages draw offline, from `file://` or GitHub Pages, with hover and zoom, and nothing is
fetched from a CDN. Every string from a report reaches the page escaped
(`perfguard.presentation.escape`): element text through `html_text`, attribute values
through `html_attr` (both show control and bidi characters as `\\u202e`), data through a
JSON block no browser executes (`script_json`), and plotly labels through the page
script's `esc()`, which shows them too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from perfguard.errors import PerfguardError
from perfguard.metrics import is_metric_name, metric_sort_key, unit
from perfguard.presentation.attribution import html_section
from perfguard.presentation.escape import html_attr, html_text, script_json
from perfguard.presentation.observed import SERVER_COLUMNS, server_rows

ASSETS = ("common.js", "forest.js", "series.js", "style.css")


def asset_text(name: str) -> str:
    """One of perfguard's page assets (`presentation/assets/`)."""
    return (resources.files("perfguard.presentation") / "assets" / name).read_text("utf-8")


def plotly_js_path() -> Path:
    """plotly.min.js as the plotly wheel ships it (no download, no CDN)."""
    try:
        import plotly
    except ImportError as exc:  # a core dependency; a broken install says so
        raise PerfguardError("HTML pages need plotly: pip install 'plotly>=5.20'") from exc
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise PerfguardError(f"{path}: plotly's bundled JavaScript is missing (reinstall plotly)")
    return path


def esc(value: object) -> str:
    """A report's string as HTML element text (`escape.html_text`: controls shown)."""
    return html_text(value)


def attr(value: object) -> str:
    """A string as a double-quoted attribute value (`escape.html_attr`: controls shown)."""
    return html_attr(value)


def _inline_script(code: str) -> str:
    return "<script>" + code.replace("</script", "<\\/script") + "</script>"


def page(
    title: str,
    body: str,
    *,
    data: Mapping[str, Any],
    data_id: str,
    scripts: Sequence[str],
    asset_prefix: str | None,
    plotly: bool = True,
) -> str:
    """A whole HTML page. `asset_prefix` None: every script and the stylesheet inlined (a
    self-contained file); else they are loaded from `asset_prefix` (`assets/`, `../assets/`)
    relative to the page, as the site shares them. `plotly` False: a page without plots
    (the site's index) does not load the 4.8 MB library."""
    if asset_prefix is None:
        style = "<style>" + asset_text("style.css") + "</style>"
        code = [_inline_script(plotly_js_path().read_text("utf-8"))] if plotly else []
        code += [_inline_script(asset_text(s)) for s in ("common.js", *scripts)]
    else:
        style = f'<link rel="stylesheet" href="{attr(asset_prefix)}style.css">'
        names = ["plotly.min.js"] if plotly else []
        code = [
            f'<script src="{attr(asset_prefix)}{name}"></script>'
            for name in (*names, "common.js", *scripts)
        ]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{esc(title)}</title>",
            style,
            "</head>",
            "<body>",
            body,
            f'<script type="application/json" id="{attr(data_id)}">{script_json(data)}</script>',
            *code,
            "</body>",
            "</html>",
            "",
        ]
    )


# ---- one report ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForestFigures:
    """A metric's figures in a forest plot, as the report or the archive holds them: the
    medians, the ratio with its interval, and the band's bounds (absolute, like the
    medians; the row gives them as ratios to the baseline)."""

    median: float | None
    baseline: float | None
    ratio: float | None
    low: float | None
    high: float | None
    bound: float | None
    improvement_bound: float | None


def forest_row(
    metric: str, figures: ForestFigures, *, verdict: str, reason: str | None
) -> dict[str, Any]:
    """One metric of a forest plot: its ratio, interval and band as ratios to the baseline."""
    baseline = figures.baseline

    def rel(value: float | None) -> float | None:
        if value is None or not baseline:
            return None
        return round(value / baseline, 6)

    def r6(value: float | None) -> float | None:
        return None if value is None else round(value, 6)

    return {
        "metric": metric,
        "unit": metric_unit(metric),
        "verdict": verdict,
        "median": r6(figures.median),
        "baseline": r6(baseline),
        "ratio": r6(figures.ratio),
        "low": r6(figures.low),
        "high": r6(figures.high),
        "band_low": rel(figures.improvement_bound),
        "band_high": rel(figures.bound),
        "reason": reason or "",
    }


def metric_unit(metric: str) -> str:
    """ms or MB for perfguard's metrics; nothing for any other (a counter such as
    `ops:<Stage>` or `syncs:<Stage>` counts)."""
    try:
        return unit(metric) if is_metric_name(metric) else ""
    except ValueError:
        return ""


def report_cases(report: Any) -> list[dict[str, Any]]:
    """A `storage.reports.Report`'s cases as forest-plot data."""
    out = []
    for i, case in enumerate(report.cases):
        rows = []
        for m in sorted(case.metrics, key=lambda m: _sort_key(m.metric)):
            figures = ForestFigures(
                median=None if m.measured is None else m.measured.median,
                baseline=None if m.baseline is None else m.baseline.median,
                ratio=m.ratio,
                low=m.low,
                high=m.high,
                bound=m.bound,
                improvement_bound=report.improvement_bound(m),
            )
            rows.append(forest_row(m.metric, figures, verdict=m.verdict, reason=m.reason))
        entry = {"id": case.case_id, "verdict": case.verdict, "div": f"case-{i}", "rows": rows}
        levels = server_rows(case)
        if levels:  # a server case: latency against concurrency, measured / baseline
            entry["levels"] = levels
        out.append(entry)
    return out


def _sort_key(metric: str) -> tuple[Any, ...]:
    """Known metrics in perfguard's order, then any other (a counter such as `ops:<Stage>`)
    grouped by its prefix."""
    try:
        return (0, *metric_sort_key(metric))
    except (ValueError, IndexError):
        return (1, 0, 0, metric)


def forest_body(
    title: str, facts: Iterable[tuple[str, str]], cases: list[dict[str, Any]], *, extra: str = ""
) -> str:
    """The page body: a title, a facts line, each case's plot and its table."""
    parts = [f"<h1>{esc(title)}</h1>", extra]
    parts.append(
        '<p class="meta">' + " · ".join(f"{esc(k)}: <b>{esc(v)}</b>" for k, v in facts) + "</p>"
    )
    for case in cases:
        parts.append(
            f'<h2 class="case" data-case="{attr(case["id"])}">{esc(case["id"])} '
            f'<span class="{attr(case["verdict"])}">{esc(case["verdict"])}</span></h2>'
        )
        if case.get("levels"):
            head = "".join(f"<th>{esc(c)}</th>" for c in SERVER_COLUMNS)
            parts.append(
                "<p>Latency against concurrency (measured / baseline)</p>"
                f"<table><thead><tr>{head}</tr></thead><tbody>"
            )
            for row in case["levels"]:
                parts.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>")
            parts.append("</tbody></table>")
        parts.append(f'<div class="plot forest" id="{attr(case["div"])}"></div>')
        parts.append(
            "<table><thead><tr><th>metric</th><th>median</th><th>baseline</th><th>ratio</th>"
            "<th>interval</th><th>band</th><th>verdict</th><th>reason</th></tr></thead><tbody>"
        )
        for r in case["rows"]:
            band = "-"
            if r["band_high"] is not None:
                low = "-" if r["band_low"] is None else f"{r['band_low']:.3f}"
                band = f"{low} to {r['band_high']:.3f}"
            interval = "-"
            if r["low"] is not None and r["high"] is not None:
                interval = f"{r['low']:.3f} to {r['high']:.3f}"
            parts.append(
                f'<tr data-metric="{attr(r["metric"])}"><td>{esc(r["metric"])}</td>'
                f'<td class="num">{_num(r["median"])} {esc(r["unit"])}</td>'
                f'<td class="num">{_num(r["baseline"])}</td>'
                f'<td class="num">{_num(r["ratio"])}</td><td class="num">{interval}</td>'
                f'<td class="num">{band}</td>'
                f'<td class="{attr(r["verdict"])}">{esc(r["verdict"])}</td>'
                f"<td>{esc(r['reason'])}</td></tr>"
            )
        parts.append("</tbody></table>")
    return "\n".join(parts)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render_report_html(report: Any, *, source: str = "report") -> str:
    """`report render --format html`: one self-contained page (plotly inlined)."""
    env = report.environment
    facts = [
        ("verdict", report.verdict),
        ("profile", report.judgement.profile),
        ("commit", str(env.get("git_commit") or "-")),
        ("platform", str(env.get("platform") or "-")),
        ("hardware", str(env.get("hardware") or "-")),
        ("created", report.created),
    ]
    extra = ""
    inject = report.settings.get("inject")
    if inject:
        extra = (
            f'<p class="warn">Measured with a fault injection ({esc(inject)}): its slowdown '
            "was made on purpose.</p>"
        )
    extra += html_section(getattr(report, "attribution", None))
    cases = report_cases(report)
    body = forest_body(f"perfguard report: {source}", facts, cases, extra=extra)
    return page(
        f"perfguard: {source}",
        body,
        data={"cases": cases},
        data_id="perfguard-report",
        scripts=["forest.js"],
        asset_prefix=None,
    )
