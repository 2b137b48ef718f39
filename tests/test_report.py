"""Reports: the JSON model, Markdown for PR comments (escaped), console table, merge."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from perfguard.decision.stats import Summary
from perfguard.decision.tolerances import default_profiles
from perfguard.decision.verdict import judge
from perfguard.errors import PerfguardError
from perfguard.presentation import render
from perfguard.presentation.markdown import append_step_summary, render_markdown
from perfguard.results import CaseResult, Results
from perfguard.storage import reports as rep
from perfguard.storage.baseline import Baseline, Scenario
from perfguard.storage.jsonio import validate

EVIL = "x|y</details><script>alert(1)</script>`[a](b)` @team #1"


def make_report(
    cases: dict[str, dict[str, list[float]]],
    scenarios: dict[str, dict[str, float]],
    *,
    notes: str | None = None,
    sha: str = "0" * 64,
    errors: tuple[str, ...] = (),
    **settings: Any,
) -> rep.Report:
    baseline = Baseline(
        metadata={"platform": "cpu", "hardware": "test-cpu", "created": "t", "updated": "t"},
        profiles=default_profiles("cpu"),
        scenarios={
            cid: Scenario(metrics={m: Summary(v, 5) for m, v in ms.items()}, notes=notes)
            for cid, ms in scenarios.items()
        },
    )
    results = Results(
        environment={"platform": "cpu", "hardware": "test-cpu", "hostname": "h"},
        settings={},
        cases={
            cid: CaseResult(case_id=cid, samples=s, output_hash="f00d") for cid, s in cases.items()
        },
    )
    for cid in errors:
        results.cases[cid] = CaseResult(case_id=cid, status="error", error="RuntimeError: boom")
    return rep.build(
        judge(results, baseline),
        environment=results.environment,
        baseline_info={"path": "baselines/cpu/test-cpu.json", "sha256": sha},
        profile=baseline.profile("pr_test").to_json(),
        settings={"source": "run", "inject": None, **settings},
        improvement_threshold=0.2,
    )


def regressed() -> rep.Report:
    return make_report(
        {"a": {"e2e": [30.0], "stage:DenoisingStage": [25.0]}, "b": {"e2e": [5.0]}},
        {"a": {"e2e": 20.0, "stage:DenoisingStage": 10.0}, "b": {"e2e": 10.0}},
    )


def test_report_json_is_valid_and_round_trips(tmp_path: Path) -> None:
    report = regressed()
    path = tmp_path / "r.json"
    rep.write_report(path, report)
    data = json.loads(path.read_text())
    validate(data, "report", "r.json")
    assert (data["verdict"], data["exit_code"]) == ("fail", 1)
    den = data["cases"]["a"]["metrics"]["stage:DenoisingStage"]
    assert den["verdict"] == "regression"
    # the measured profile: 3 % minimum effect above the 10 us timer floor
    assert (den["baseline"]["median"], den["bound"], den["ratio"]) == (10.0, 10.3, 2.5)
    assert den["measured"]["samples"] == [25.0]
    assert data["cases"]["a"]["output_hash"] == "f00d"
    assert rep.read_report(path).to_json() == data


def test_a_report_whose_verdict_disagrees_with_its_cases_is_refused(tmp_path: Path) -> None:
    data = regressed().to_json()
    data["verdict"], data["exit_code"] = "pass", 0
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PerfguardError, match=r"\$\.verdict"):
        rep.read_report(path)


def test_markdown_has_a_summary_line_regressions_first_and_collapsed_details() -> None:
    md = render_markdown(regressed())
    lines = md.splitlines()
    assert lines[0].startswith("### ❌ perfguard FAIL: 2 regression")
    assert lines.index("#### Regressions (2)") < lines.index(
        "#### Improvements (1): the baseline is stale, not a failure"
    )
    assert "<details><summary>All metrics</summary>" in md and md.rstrip().endswith("</details>")


def test_markdown_improvements_come_with_the_exact_tighten_command() -> None:
    md = render_markdown(regressed())
    cmd = (
        "perfguard gen-baselines --tighten --platform cpu "
        "--baseline baselines/cpu/test-cpu.json --case b"
    )
    assert f"```sh\n{cmd}\n```" in md


def test_markdown_escapes_case_ids_notes_and_errors_so_nothing_injects_markup() -> None:
    report = make_report(
        {EVIL: {"e2e": [30.0]}},
        {EVIL: {"e2e": 10.0}},
        notes=EVIL + "\n\n# heading",
        errors=(),
    )
    md = render_markdown(report)
    assert "<script>" not in md and "</script>" not in md
    assert md.count("</details>") == 1 and md.count("<details>") == 1
    assert "@team" not in md and "#1" not in md and "\n# heading" not in md
    assert "](b)" not in md.replace("\\](b)", "")
    # The id's `|` must not add cells: every table row has as many cells as its header.
    for block in re.findall(r"(?:^\|.*\n)+", md, flags=re.M):
        rows = block.splitlines()
        cells = {len(re.split(r"(?<!\\)\|", r)) for r in rows}
        assert len(cells) == 1, block
    # An id that is not shell- and Markdown-safe is left out of the command.
    assert "--case x" not in md


def test_markdown_names_an_injected_slowdown_and_failed_cases() -> None:
    report = make_report(
        {"a": {"e2e": [10.0]}},
        {"a": {"e2e": 10.0}},
        errors=("broken",),
        inject="DenoisingStage=+50%",
    )
    md = render_markdown(report)
    assert "injected slowdown: DenoisingStage=+50%" in md
    assert "#### Cases that failed to run (1)" in md and "RuntimeError: boom" in md


def test_console_table_puts_regressions_first_and_respects_no_color(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=200)
    render.render_table(regressed(), console)
    text = buf.getvalue()
    assert "\x1b[31m" not in text and "\x1b[32m" not in text  # no red, no green
    body = [line for line in text.splitlines() if "│" in line]
    assert "regression" in body[0] and "regression" in body[1]
    assert "improvement" in body[2]


def test_console_table_prints_rich_markup_in_case_ids_literally() -> None:
    buf = io.StringIO()
    report = make_report({"[bold]x[/bold]": {"e2e": [10.0]}}, {})
    render.render_table(report, Console(file=buf, width=200))
    assert "[bold]x[/bold]" in buf.getvalue()


def test_merge_combines_disjoint_shards_and_recomputes_the_verdict() -> None:
    one = make_report({"a": {"e2e": [10.0]}}, {"a": {"e2e": 10.0}, "b": {"e2e": 10.0}})
    two = make_report({"b": {"e2e": [50.0]}}, {"a": {"e2e": 10.0}, "b": {"e2e": 10.0}})
    assert (one.exit_code, two.exit_code) == (0, 1)
    merged = rep.merge([one, two], ["one.json", "two.json"])
    assert [c.case_id for c in merged.cases] == ["a", "b"]
    assert (merged.verdict, merged.exit_code) == ("fail", 1)
    data = merged.to_json()
    validate(data, "report", "merged")
    assert [m["cases"] for m in data["merged_from"]] == [["a"], ["b"]]


def test_merge_refuses_overlapping_shards_and_different_baselines() -> None:
    one = make_report({"a": {"e2e": [10.0]}}, {"a": {"e2e": 10.0}})
    with pytest.raises(PerfguardError, match="case 'a' is in both"):
        rep.merge([one, one], ["one.json", "again.json"])
    other = make_report({"b": {"e2e": [10.0]}}, {}, sha="1" * 64)
    with pytest.raises(PerfguardError, match="baseline file"):
        rep.merge([one, other])


def test_step_summary_is_appended_when_github_sets_it(tmp_path: Path) -> None:
    target = tmp_path / "summary.md"
    target.write_text("earlier step\n")
    assert append_step_summary("# ours", {"GITHUB_STEP_SUMMARY": str(target)}) == target
    assert target.read_text() == "earlier step\n# ours\n"
    assert append_step_summary("# ours", {}) is None
