"""The published history site and the HTML report: files, escaping, and a real browser.

The `browser` tests open the pages in Debian's headless chromium (tests/browser.py) and
check what a person would see: no console error, the series of both hardware and their
change points in the page, a hover that names the commit, no request leaving `file://`,
hostile strings shown as text. Their screenshots go to `test-artifacts/` (CI keeps it).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

import perfguard.presentation.site as site_mod
from perfguard.presentation.escape import script_json
from perfguard.storage.archive import ReportRecord, add_records, add_reports
from tests.helpers import history_report as _report  # a real report made by the library

PG = Any
HOSTILE = '</script><script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'


def _record(
    i: int,
    hw: str,
    level: float,
    *,
    case: str = "qwen_image_t2i_smoke",
    commit: str | None = None,
    metrics: tuple[str, ...] = ("e2e", "stage:DenoisingStage", "ops:DenoisingStage"),
    reason: str = "",
) -> ReportRecord:
    rows = []
    for metric in metrics:
        base = 100.0 if metric.startswith("ops:") else 20.0
        value = base if metric.startswith("ops:") else level
        ratio = value / base
        verdict = "regression" if ratio > 1.05 else "pass"
        rows.append(
            (case, metric, 5, value, 0.1, value * 0.99, value * 1.01, base, ratio, verdict,
             base * 1.05, base * 0.9, ratio * 0.99, ratio * 1.01, reason or None)
        )  # fmt: skip
    return ReportRecord(
        content_hash=hashlib.sha256(f"{hw}-{i}-{level}-{case}".encode()).hexdigest(),
        source=f"r{i}.json",
        git_commit=commit or f"{i:04d}abcdef",
        date=f"2026-06-{1 + i // 2:02d}T{i % 24:02d}:00:00+00:00",
        platform="cuda",
        hardware=hw,
        profile="long_term",
        verdict="fail" if level > 21 else "pass",
        inject=None,
        environment={},
        rows=rows,
    )


def _two_hardware(db: str | Path) -> None:
    """16 commits measured on two hardware, each runner adding its own reports; the
    denoising stage on h100 steps +30 % at commit 8 (report 16), h200 stays flat."""
    for c in range(16):
        commit = f"{c:04d}abcdef"
        add_records(db, [_record(2 * c, "h100-sxm", 26.0 if c >= 8 else 20.0, commit=commit)])
        add_records(db, [_record(2 * c + 1, "h200-sxm", 20.0, commit=commit)])


@pytest.fixture
def two_hardware(tmp_path: Path) -> Path:
    db = tmp_path / "h.sqlite"
    _two_hardware(db)
    return db


def test_publish_writes_an_index_a_page_per_case_and_per_report(
    archive_db: str, tmp_path: Path, pg: PG
) -> None:
    """On SQLite and on PostgreSQL: two runners' reports in one archive, one site."""
    _two_hardware(archive_db)
    out = tmp_path / "site"
    code, stdout, err = pg("history", "publish", "--db", archive_db, "--out", str(out))
    assert code == 0, err
    assert "32 report(s), 1 case(s), 2 hardware" in stdout
    assert (out / "assets" / "plotly.min.js").stat().st_size > 1_000_000
    (case_page,) = out.glob("case-*.html")
    assert len(list((out / "reports").glob("*.html"))) == 32
    html = case_page.read_text()
    data = json.loads(re.search(r'id="perfguard-series">(.*?)</script>', html).group(1))
    metrics = {m["m"]: m for m in data["metrics"]}
    assert set(metrics) == {"e2e", "stage:DenoisingStage", "ops:DenoisingStage"}
    den = metrics["stage:DenoisingStage"]
    assert sorted(s["key"] for s in den["series"]) == ["cuda/h100-sxm", "cuda/h200-sxm"]
    (change,) = den["changes"]
    assert data["x"][change["x"]] == "0008abcd" and change["dir"] == "slower"
    assert '<h2 id="g-ops-' in html  # a counter family gets its own section
    index = (out / "index.html").read_text()
    assert "What moved most recently" in index and "0008abcdef" in index
    # every local link resolves; nothing points off the site
    for page in [out / "index.html", case_page, *(out / "reports").glob("*.html")][:6]:
        for ref in re.findall(r'(?:href|src)="([^"#]+)', page.read_text()):
            assert not re.match(r"[a-z]+:", ref), (page, ref)
            assert (page.parent / ref).resolve().is_file(), (page, ref)


def test_publish_replaces_the_site_whole_and_a_failure_leaves_the_old(
    two_hardware: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "site"
    site_mod.publish(two_hardware, out)
    (out / "stale.html").write_text("old")
    site_mod.publish(two_hardware, out)
    assert not (out / "stale.html").exists()
    before = sorted(p.name for p in out.rglob("*"))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(site_mod.shutil, "copyfile", broken)
    with pytest.raises(OSError):
        site_mod.publish(two_hardware, out)
    assert sorted(p.name for p in out.rglob("*")) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_publish_of_an_empty_or_missing_archive_is_exit_2(tmp_path: Path, pg: PG) -> None:
    code, _, err = pg("history", "publish", "--db", str(tmp_path / "no.sqlite"), "--out", "x")
    assert code == 2 and "no such history database" in err


def test_script_json_cannot_close_its_script_block() -> None:
    text = script_json({"id": HOSTILE, "sep": "\u2028"})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == {"id": HOSTILE, "sep": "\u2028"}


def _hostile_report(path: Path) -> Path:
    _report(path, 23.0, seed=3)
    data = json.loads(path.read_text())
    case = data["cases"].pop("qwen_image_t2i_smoke") if isinstance(data["cases"], dict) else None
    if case is not None:
        data["cases"][HOSTILE] = case
    else:
        data["cases"][0]["case_id"] = HOSTILE
    data["environment"]["hardware"] = HOSTILE  # a commit is hex digits (the schema)
    path.write_text(json.dumps(data))
    return path


def test_report_render_html_is_one_file_with_every_case_and_hostile_text_escaped(
    tmp_path: Path, pg: PG
) -> None:
    rep = _hostile_report(tmp_path / "r.json")
    out = tmp_path / "r.html"
    code, _, err = pg("report", "render", str(rep), "--format", "html", "--out", str(out))
    assert code == 0, err
    html = out.read_text()
    assert "<script src=" not in html and "<link" not in html  # self-contained
    assert HOSTILE not in html and "&lt;/script&gt;" in html
    assert html.count("<script>window.__pwned") == 0


# ---- in the browser ------------------------------------------------------------------------


@pytest.mark.browser
def test_the_site_in_chromium_shows_both_hardware_their_change_points_and_hover(
    two_hardware: Path, tmp_path: Path, chromium: Any
) -> None:
    from browser import screenshot, visit

    out = tmp_path / "site"
    site_mod.publish(two_hardware, out)
    index = visit(chromium, (out / "index.html").as_uri())
    assert index.page.locator("#moved tr.change").count() == 2  # e2e and the stage
    assert not index.errors and not index.outside
    (case_page,) = out.glob("case-*.html")
    v = visit(chromium, case_page.as_uri())
    v.page.wait_for_function("document.body.dataset.complete === '1'", timeout=60_000)
    plot = v.page.locator('div.series[data-metric="stage:DenoisingStage"]')
    assert plot.get_attribute("data-hardware") == "cuda/h100-sxm cuda/h200-sxm"
    legend = plot.locator(".legendtext").evaluate_all("els => els.map((e) => e.textContent)")
    assert {"cuda/h100-sxm median", "cuda/h200-sxm median", "cuda/h100-sxm baseline"} <= set(legend)
    assert plot.locator(".shapelayer path").count() >= 1  # the change point's line
    assert "+30.0 % cuda/h100-sxm @ 0008abcdef" in plot.locator(".annotation").text_content()
    assert v.page.locator('li.change[data-metric="stage:DenoisingStage"]').count() == 1
    # hover the first point of the h100 median: the label names its commit and date
    plot.scroll_into_view_if_needed()
    point = plot.locator(".scatterlayer .trace").nth(3).locator(".points path").first
    box = point.bounding_box()
    assert box is not None
    v.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    v.page.wait_for_selector(".hoverlayer .hovertext", timeout=5_000)
    hover = plot.locator(".hoverlayer .hovertext").text_content() or ""
    assert "0000abcdef" in hover and "2026-06-01" in hover and "ratio" in hover
    screenshot(v, "history-site-case.png")
    # a click opens the point's report, whose forest plot draws
    v.page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    v.page.wait_for_url(re.compile(r"/reports/[0-9a-f]{16}\.html$"), timeout=10_000)
    v.page.wait_for_function("document.body.dataset.drawn === '1'", timeout=20_000)
    assert not v.errors and not v.outside and not v.dialogs, (v.errors, v.outside)


@pytest.mark.browser
def test_hostile_strings_are_inert_in_the_site_and_the_report(
    tmp_path: Path, chromium: Any, pg: PG
) -> None:
    from browser import screenshot, visit

    db = tmp_path / "h.sqlite"
    add_records(
        db,
        [
            _record(i, HOSTILE, 20.0 + 6 * (i >= 8), case=HOSTILE, commit=HOSTILE + str(i),
                    reason=HOSTILE)
            for i in range(16)
        ],
    )  # fmt: skip
    add_reports(db, [_hostile_report(tmp_path / "r.json")])
    out = tmp_path / "site"
    site_mod.publish(db, out)
    rep_html = tmp_path / "r.html"
    assert pg("report", "render", str(tmp_path / "r.json"), "--format", "html",
              "--out", str(rep_html))[0] == 0  # fmt: skip
    pages = [out / "index.html", *out.glob("case-*.html"), *(out / "reports").glob("*.html")]
    for path in [*pages[:4], rep_html]:
        v = visit(chromium, path.as_uri())
        v.page.wait_for_function(
            "document.readyState === 'complete' && (document.body.dataset.drawn !== undefined"
            " || !document.querySelector('div.plot'))",
            timeout=60_000,
        )
        v.page.wait_for_timeout(300)
        assert v.page.evaluate("window.__pwned") is None, path
        assert v.page.locator("img").count() == 0, path
        assert not v.errors and not v.outside and not v.dialogs, (path, v.errors)
        if path == rep_html:
            assert HOSTILE in v.page.locator("h2.case").first.inner_text()
            screenshot(v, "report-html.png")
