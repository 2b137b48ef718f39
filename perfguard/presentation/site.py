"""`perfguard history publish`: the archive as a static site people browse by commit.

The site is plain files (no server; it works from `file://` and on GitHub Pages) and
requests nothing from the internet: plotly.js is copied from the plotly wheel into
`assets/`. It holds:

- `index.html`: what moved most recently (every change point, newest first, with its
  size, direction, hardware and a link to its series), the newest report of each
  hardware with its verdict, and the cases;
- `case-<id>.html` per case: every metric of every stage and counter over commits,
  grouped by its prefix (`stage:`, `step:`, memory, and any other such as `ops:`,
  `flops:`, `alloc:` or `syncs:`), one plot per metric with one line per hardware side by
  side: the median with the run's min-max as error bars, the baseline with its tolerance
  band shaded, points coloured by verdict, change points as dashed lines with their size,
  and a hover with commit, date, ratio and interval; a click opens the point's report;
- `reports/<hash>.html` per report: its forest plot (the page `report render --format
  html` writes), from the figures the archive keeps.

Choices made for the size of a real archive (1,000 reports x 2 cases x 40 metrics: see
`benchmarks/history_site.py`): the data is columnar JSON per case with six significant
digits, shared scripts are files (not inlined in each page), and a case page draws the
plots in view first and the rest in the background, so it is usable before all are drawn.
A series is (platform, hardware, case, metric), as in `history changes`.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfguard.errors import PerfguardError
from perfguard.presentation.escape import shorten, show_controls
from perfguard.presentation.history import changes, load
from perfguard.presentation.html import (
    ASSETS,
    ForestFigures,
    asset_text,
    attr,
    esc,
    forest_body,
    forest_row,
    metric_unit,
    page,
    plotly_js_path,
)

PALETTE = ("#1f77b4", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f")
"""Hardware colours (lines); red, green and orange are kept for verdicts (points)."""

GROUPS = ("end to end", "stages", "memory", "steps")


def group_of(metric: str) -> str:
    """The section of a case page a metric is drawn in: perfguard's own classes, else the
    metric's prefix before `:` (a counter family such as `ops` or `syncs`)."""
    if metric in ("e2e", "step_avg", "step_median"):
        return "end to end"
    if metric.startswith("stage:"):
        return "stages"
    if metric == "peak_memory" or metric.startswith("peak_memory:"):
        return "memory"
    if metric.startswith("step:"):
        return "steps"
    return metric.split(":", 1)[0] if ":" in metric else "other"


def _group_order(name: str) -> tuple[int, str]:
    if name in GROUPS[:3]:
        return (GROUPS.index(name), name)
    return (9 if name == "steps" else 5, name)


def _metric_order(metric: str) -> tuple[Any, ...]:
    if metric.startswith("step:") and metric[5:].isdigit():
        return (0, int(metric[5:]), metric)
    return (1, 0, metric)


def slug(text: str) -> str:
    """A file or anchor name for any string: readable characters kept, the rest replaced,
    and a hash of the whole so that two ids never share a name."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._")[:60] or "x"
    return f"{base}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


NAV_ID = 48
"""How many characters of a case id the navigation, the index and its tables show (a
100 kB id would be printed in full on every page); the case's own page shows it whole."""


def short_id(case: str) -> str:
    """A case id as one of many: controls shown, at most `NAV_ID` characters, and when cut,
    the hash its page's name ends with, so that two long ids never read the same."""
    shown = shorten(case, NAV_ID)
    if shown == show_controls(case):
        return shown
    return f"{shown} ({hashlib.sha256(case.encode()).hexdigest()[:8]})"


def _g(value: Any) -> float | None:
    """A JSON number with six significant digits, or null (None, NaN, infinity)."""
    if value is None or value != value or value in (math.inf, -math.inf):
        return None
    return float(f"{value:.6g}")


def _g_all(values: Any) -> list[float | None]:
    """`_g` over a column at once (numpy): the site rounds about a million figures."""
    a = np.asarray(values, dtype=float)
    out = np.full(a.shape, np.nan)
    ok = np.isfinite(a)
    out[ok & (a == 0)] = 0.0
    nz = ok & (a != 0)
    digits = 5 - np.floor(np.log10(np.abs(a[nz]))).astype(int)  # six significant digits
    scale = np.power(10.0, np.abs(digits))
    x = a[nz]
    with np.errstate(all="ignore"):  # subnormal magnitudes: keep the figure as it is
        r = np.where(digits >= 0, np.round(x * scale) / scale, np.round(x / scale) * scale)
    out[nz] = np.where(np.isfinite(r) & (r != 0), r, x)
    return [None if v != v else v for v in out.tolist()]


def _s(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)


def _hw_key(platform: Any, hardware: Any) -> str:
    return f"{_s(platform) or '?'}/{_s(hardware) or '?'}"


class _Site:
    """The pages of one archive, built in memory (`files`: relative path -> text)."""

    def __init__(self, frame: pd.DataFrame, title: str) -> None:
        self.frame = frame
        self.title = title
        self.files: dict[str, str] = {}
        frame["hw"] = [
            _hw_key(p, h) for p, h in zip(frame["platform"], frame["hardware"], strict=True)
        ]
        reports = frame.drop_duplicates("report_id")
        self.reports = reports.reset_index(drop=True)
        self.hw = list(dict.fromkeys(self.reports["hw"]))
        self.colour = {h: PALETTE[i % len(PALETTE)] for i, h in enumerate(self.hw)}
        # The x axis: one category per commit (reports without a commit: their date),
        # ordered by first appearance; labels never repeat.
        keys = [
            _s(c) or f"@{str(d)[:19]}"
            for c, d in zip(self.reports["commit_sha"], self.reports["date"], strict=True)
        ]
        order = list(dict.fromkeys(keys))
        seen: dict[str, int] = {}
        self.x_label: dict[str, str] = {}
        for key in order:
            short = key[:16] if key.startswith("@") else key[:8]
            seen[short] = seen.get(short, 0) + 1
            self.x_label[key] = short if seen[short] == 1 else f"{short}~{seen[short]}"
        self.x_of_report = {
            int(rid): self.x_label[k]
            for rid, k in zip(self.reports["report_id"], keys, strict=True)
        }
        self.href = {
            int(rid): f"reports/{str(h)[:16]}.html"
            for rid, h in zip(self.reports["report_id"], self.reports["content_hash"], strict=True)
        }
        self.cases = sorted(frame["case"].unique())
        self.case_file = {c: f"case-{slug(c)}.html" for c in self.cases}
        self.changes = changes(frame)

    # ---- pages -------------------------------------------------------------------------

    def build(self) -> dict[str, str]:
        for case in self.cases:
            self.case_page(case)
        self.report_pages()
        self.index_page()
        return self.files

    def nav(self, prefix: str = "") -> str:
        links = [f'<a href="{prefix}index.html">index</a>']
        links += [
            f'<a href="{prefix}{self.case_file[c]}">{esc(short_id(c))}</a>' for c in self.cases
        ]
        return "<nav>" + "".join(links) + "</nav>"

    def case_page(self, case: str) -> None:
        rows = self.frame[self.frame["case"] == case]
        metrics = sorted(rows["metric"].unique(), key=_metric_order)
        by_group: dict[str, list[str]] = {}
        for m in metrics:
            by_group.setdefault(group_of(m), []).append(m)
        case_changes = [c for c in self.changes if c["case"] == case]
        report_ids = list(dict.fromkeys(int(r) for r in rows["report_id"]))
        rindex = {rid: i for i, rid in enumerate(report_ids)}
        xs = list(dict.fromkeys(self.x_of_report[rid] for rid in report_ids))
        xindex = {x: i for i, x in enumerate(xs)}
        data_metrics = []
        body = [self.nav(), f"<h1>{esc(case)}</h1>", self._case_meta(rows, len(report_ids))]
        grouped = {name: g for name, g in rows.groupby("metric", sort=False)}
        for group in sorted(by_group, key=_group_order):
            body.append(f'<h2 id="g-{attr(slug(group))}">{esc(group)}</h2>')
            for metric in by_group[group]:
                changes = [c for c in case_changes if c["metric"] == metric]
                entry, html = self._metric_plot(metric, grouped[metric], changes, rindex, xindex)
                data_metrics.append(entry)
                body += html
        data = {
            "case": case,
            "x": xs,
            "hw": [{"key": h, "colour": self.colour[h]} for h in self.hw],
            "reports": self._reports_js(report_ids),
            "metrics": data_metrics,
        }
        self.files[self.case_file[case]] = page(
            f"{self.title}: {short_id(case)}",
            "\n".join(body),
            data=data,
            data_id="perfguard-series",
            scripts=["series.js"],
            asset_prefix="assets/",
        )

    def _reports_js(self, report_ids: list[int]) -> list[dict[str, Any]]:
        """Each report of a case page, as its script reads them: commit, date, link,
        injection."""
        rep = self.reports.set_index("report_id")
        return [
            {
                "c": _s(rep.at[rid, "commit_sha"]),
                "d": str(rep.at[rid, "date"])[:19],
                "h": self.href[rid],
                "i": _s(rep.at[rid, "inject"]),
            }
            for rid in report_ids
        ]

    def _case_meta(self, rows: pd.DataFrame, reports: int) -> str:
        """The case page's line under its title: reports, hardware, how to read a plot."""
        return (
            f'<p class="meta">{reports} report(s) · hardware: '
            + ", ".join(
                f'<b style="color:{self.colour[h]}">{esc(h)}</b>'
                for h in self.hw
                if h in set(rows["hw"])
            )
            + " · a point in its hardware's colour passed; "
            '<span class="regression">red</span>: regression, '
            '<span class="improvement">green</span>: improvement, orange: any other verdict; '
            "shaded: the tolerance band around the dashed baseline; vertical dashed lines: "
            "change points; click a point for its report</p>"
        )

    def _metric_plot(
        self,
        metric: str,
        mrows: pd.DataFrame,
        changes: list[dict[str, Any]],
        rindex: dict[int, int],
        xindex: dict[str, int],
    ) -> tuple[dict[str, Any], list[str]]:
        """One metric of a case page: its series and change points for the script, and
        its plot's HTML with the list of its change points."""
        div = "m-" + slug(metric)
        series = [
            self._series(h, hrows, rindex, xindex) for h, hrows in mrows.groupby("hw", sort=False)
        ]
        mch = [
            {
                "hw": self.hw.index(_hw_key(c["platform"], c["hardware"])),
                "x": xindex[self.x_of_report[c["report_id"]]],
                "ratio": _g(c["ratio"]),
                "dir": c["direction"],
                "c": _s(c["commit"]),
                "d": str(c["date"])[:19],
            }
            for c in changes
        ]
        entry = {"m": metric, "unit": metric_unit(metric), "div": div, "series": series,
                 "changes": mch}  # fmt: skip
        hws = " ".join(sorted({s["key"] for s in series}))
        html = [
            f'<h3>{esc(metric)}</h3><div class="plot series" id="{div}" '
            f'data-metric="{attr(metric)}" data-hardware="{attr(hws)}" '
            f'data-changes="{len(mch)}"></div>'
        ]
        if mch:
            html.append('<ul class="changes">')
            html += [
                f'<li class="change {attr(c["dir"])}" data-metric="{attr(metric)}" '
                f'data-commit="{attr(c["c"] or "")}">{esc(self.hw[c["hw"]])}: '
                f"{_pct(c['ratio'])} {esc(c['dir'])} at {esc(c['c'] or '?')} "
                f"({esc(c['d'])})</li>"
                for c in mch
            ]
            html.append("</ul>")
        return entry, html

    def _series(
        self, hw: str, rows: pd.DataFrame, rindex: dict[int, int], xindex: dict[str, int]
    ) -> dict[str, Any]:
        rows = rows.dropna(subset=["median"])

        def col(name: str) -> list[float | None]:
            return _g_all(rows[name].to_numpy(dtype=float, na_value=np.nan))

        return {
            "key": hw,
            "hw": self.hw.index(hw),
            "x": [xindex[self.x_of_report[int(r)]] for r in rows["report_id"]],
            "r": [rindex[int(r)] for r in rows["report_id"]],
            "med": col("median"),
            "lo": col("min"),
            "hi": col("max"),
            "iqr": col("iqr"),
            "base": col("baseline"),
            "bound": col("bound"),
            "ibound": col("improvement_bound"),
            "ratio": col("ratio"),
            "rlo": col("ratio_low"),
            "rhi": col("ratio_high"),
            "v": [_s(v) or "-" for v in rows["verdict"]],
        }

    def report_pages(self) -> None:
        """A forest-plot page per report. Plain dicts, not pandas, in this loop: it runs
        once per report (a thousand times), where a groupby or itertuples per report costs
        more than the page."""
        info = self.reports.set_index("report_id").to_dict("index")
        for rid, per_case in self._forest_rows().items():
            self._report_page(rid, per_case, info[rid])

    def _forest_rows(self) -> dict[int, dict[str, list[dict[str, Any]]]]:
        """report id -> case -> its forest rows, read column by column from the frame."""
        cols = [
            "report_id", "case", "metric", "verdict", "median", "baseline", "ratio",
            "ratio_low", "ratio_high", "bound", "improvement_bound", "reason",
        ]  # fmt: skip
        by_report: dict[int, dict[str, list[dict[str, Any]]]] = {}
        columns = [
            _g_all(self.frame[c].to_numpy(dtype=float, na_value=np.nan))
            if c in cols[4:-1] else self.frame[c].tolist()
            for c in cols
        ]  # fmt: skip
        for rid, case, metric, verdict, *values, reason in zip(*columns, strict=True):
            figures = ForestFigures(*values)  # median ... improvement_bound, in cols' order
            row = forest_row(str(metric), figures, verdict=_s(verdict) or "-", reason=_s(reason))
            by_report.setdefault(int(rid), {}).setdefault(str(case), []).append(row)
        return by_report

    def _report_page(
        self, rid: int, per_case: dict[str, list[dict[str, Any]]], first: dict[str, Any]
    ) -> None:
        """One report's page: its facts line, a warning if injected, a plot per case."""
        cases = []
        for i, case in enumerate(sorted(per_case)):
            forest = per_case[case]
            cases.append(
                {"id": case, "verdict": _case_verdict(forest), "div": f"case-{i}",
                 "rows": forest}
            )  # fmt: skip
        facts = [
            ("verdict", _s(first["report_verdict"]) or "-"),
            ("profile", _s(first["profile"]) or "-"),
            ("commit", _s(first["commit_sha"]) or "-"),
            ("hardware", first["hw"]),
            ("date", str(first["date"])[:19]),
        ]
        extra = self.nav("../")
        if _s(first["inject"]):
            extra += (
                f'<p class="warn">Measured with a fault injection ({esc(first["inject"])}):'
                " its slowdown was made on purpose.</p>"
            )
        name = str(first["content_hash"])[:16]
        self.files[self.href[rid]] = page(
            f"{self.title}: report {name}",
            forest_body(f"report {name}", facts, cases, extra=extra),
            data={"cases": cases},
            data_id="perfguard-report",
            scripts=["forest.js"],
            asset_prefix="../assets/",
        )

    def index_page(self) -> None:
        """The front page: the span of the archive, what moved most recently, the newest
        report of each hardware, and the cases."""
        moved = sorted(self.changes, key=lambda c: (str(c["date"]), c["report_id"]), reverse=True)
        dates = sorted(str(d) for d in self.reports["date"])
        body = [
            self.nav(),
            f"<h1>{esc(self.title)}</h1>",
            f'<p class="meta">{len(self.reports)} report(s) from {esc(dates[0][:10])} to '
            f"{esc(dates[-1][:10])} · {len(self.cases)} case(s) · hardware: "
            + ", ".join(f'<b style="color:{self.colour[h]}">{esc(h)}</b>' for h in self.hw)
            + "</p>",
            "<h2>What moved most recently</h2>",
            *self._moved_table(moved),
            *self._newest_table(),
            "<h2>Cases</h2><ul>",
        ]
        for c in self.cases:
            n = self.frame[self.frame["case"] == c]["metric"].nunique()
            link = f'<a href="{self.case_file[c]}">{esc(short_id(c))}</a>'
            body.append(f"<li>{link} ({n} metrics)</li>")
        body.append("</ul>")
        self.files["index.html"] = page(
            self.title,
            "\n".join(body),
            data={"changes": len(moved)},
            data_id="perfguard-index",
            scripts=[],
            asset_prefix="assets/",
            plotly=False,
        )

    def _moved_table(self, moved: list[dict[str, Any]]) -> list[str]:
        """The 200 newest change points, each linked to its report and its series."""
        if not moved:
            return [
                "<p>No change point yet (a series needs at least 6 reports, two levels of 3).</p>"
            ]
        body = [
            '<table id="moved"><thead><tr><th>date</th><th>commit</th><th>hardware</th>'
            "<th>case</th><th>metric</th><th>change</th></tr></thead><tbody>"
        ]
        for c in moved[:200]:
            hw = _hw_key(c["platform"], c["hardware"])
            link = f"{self.case_file[c['case']]}#m-{slug(c['metric'])}"
            body.append(
                f'<tr class="change" data-metric="{attr(c["metric"])}">'
                f"<td>{esc(str(c['date'])[:19])}</td>"
                f'<td><a href="{attr(self.href[c["report_id"]])}">'
                f"{esc(_s(c['commit']) or '?')}</a></td><td>{esc(hw)}</td>"
                f"<td>{esc(short_id(c['case']))}</td>"
                f'<td><a href="{attr(link)}">{esc(c["metric"])}</a></td>'
                f'<td class="{attr(c["direction"])}">{_pct(c["ratio"])} '
                f"{esc(c['direction'])}</td></tr>"
            )
        body.append("</tbody></table>")
        return body

    def _newest_table(self) -> list[str]:
        """Each hardware's newest report with its verdict and regression count."""
        body = [
            "<h2>Newest report of each hardware</h2><table><thead><tr><th>hardware</th>"
            "<th>date</th><th>commit</th><th>verdict</th><th>regressions</th></tr></thead><tbody>"
        ]
        for h in self.hw:
            last = self.reports[self.reports["hw"] == h].iloc[-1]
            rid = int(last["report_id"])
            rows = self.frame[self.frame["report_id"] == rid]
            n_reg = int((rows["verdict"] == "regression").sum())
            verdict = _s(last["report_verdict"]) or "-"
            body.append(
                f"<tr><td>{esc(h)}</td><td>{esc(str(last['date'])[:19])}</td>"
                f"<td>{esc(_s(last['commit_sha']) or '-')}</td>"
                f'<td class="{attr(verdict)}"><a href="{attr(self.href[rid])}">{esc(verdict)}</a>'
                f'</td><td class="num">{n_reg}</td></tr>'
            )
        body.append("</tbody></table>")
        return body


def _case_verdict(rows: list[dict[str, Any]]) -> str:
    """A case's verdict from its metrics': any regression; else the first verdict that is
    neither pass nor improvement (missing, error...); else pass."""
    verdicts = [r["verdict"] for r in rows]
    if "regression" in verdicts:
        return "regression"
    return next((v for v in verdicts if v not in ("pass", "improvement")), "pass")


def _pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{(ratio - 1) * 100:+.1f} %"


def _size(paths: Iterable[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file())


def write_site(out: str | Path, files: dict[str, str]) -> Path:
    """Write the site into a fresh directory beside `out`, then swap it in: a reader (or a
    Pages upload) sees the old site or the new one, never a mix; a failure leaves the old."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise PerfguardError(f"--out {out}: exists and is not a directory")
    parent = out.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=parent))
    except OSError as exc:
        raise PerfguardError(f"--out {out}: cannot write there: {exc.strerror or exc}") from exc
    try:
        (tmp / "assets").mkdir()
        (tmp / "reports").mkdir()
        shutil.copyfile(plotly_js_path(), tmp / "assets" / "plotly.min.js")
        for name in ASSETS:
            (tmp / "assets" / name).write_text(asset_text(name), encoding="utf-8")
        (tmp / ".nojekyll").write_text("")  # GitHub Pages: serve the files as they are
        for rel, text in files.items():
            (tmp / rel).write_text(text, encoding="utf-8")
        old = None
        if out.exists():
            old = parent / f".{out.name}.old-{os.getpid()}"
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def publish(
    db: str | Path, out: str | Path, *, since: str | None = None, title: str = "perfguard history"
) -> str:
    """Build the site from the archive and write it to `out`; a one-line summary."""
    start = time.perf_counter()
    frame = load(db, since=since)
    if frame.empty:
        from perfguard.storage.archive import locate

        raise PerfguardError(f"{locate(db).label}: the archive holds no report to publish")
    site = _Site(frame.copy(), title)
    files = site.build()
    path = write_site(out, files)
    size = _size(path.rglob("*"))
    return (
        f"{path}: {len(site.reports)} report(s), {len(site.cases)} case(s), "
        f"{len(site.hw)} hardware, {len(site.changes)} change point(s); "
        f"{len(files) + len(ASSETS) + 1} files, {size / 1e6:.1f} MB in "
        f"{time.perf_counter() - start:.1f} s; open {path / 'index.html'}"
    )
