"""What decided a verdict reaches the reader: reasons, the runner's speed, confirmations.

A row whose figures break the rule printed under the table (a median over its bound that
passed because the runner was slower) must carry its reason in the terminal table and in
the PR Markdown, not only in the JSON report.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

from rich.console import Console

from perfguard.presentation import render
from perfguard.presentation.figures import fmt_evidence, fmt_ratio
from perfguard.presentation.markdown import render_markdown
from perfguard.presentation.summary import evidence_note
from perfguard.results import component_changes
from perfguard.storage import reports as rep
from perfguard.storage.jsonio import validate
from tests.helpers import reasons_report


def _table(report: rep.Report) -> str:
    out = io.StringIO()
    render.render_table(report, Console(file=out, width=220, no_color=True))
    return out.getvalue()


def test_a_slowdown_the_runners_speed_explains_is_no_verdict_and_says_why() -> None:
    # 210 ms > bound 206 ms, credibly; the runner is 1.1x slower: 190.9 ms divided by it.
    # The reference cannot predict the pipeline to 3 % (docs/verdicts.md): no verdict,
    # where it used to pass in silence.
    report = reasons_report([210.0] * 5, [1.1] * 5)
    (m,) = report.cases[0].metrics
    assert m.verdict == "contended" and m.over
    assert (report.verdict, report.exit_code) == ("contended", 4)
    table = _table(report)
    assert "contended (1)" in table
    assert "(1) glm e2e contended: median 210.000 ms > bound 206.000 ms" in table
    assert "1.100x slower than at baseline time, which would explain it" in table
    assert "runner speed (reference workload now / at baseline time): glm 1.100x" in table
    md = render_markdown(report)
    assert "#### Reasons (1): what decided these verdicts" in md
    assert "glm e2e **contended**: median 210.000 ms &gt; bound 206.000 ms" in md
    assert "glm 1.100x" in md


def test_a_slowdown_beyond_the_runners_speed_is_still_a_regression() -> None:
    report = reasons_report([240.0] * 5, [1.1] * 5)  # 218.2 ms divided by 1.1: over 206
    assert report.cases[0].metrics[0].verdict == "regression"
    assert report.exit_code == 1


def test_a_faster_runner_excuses_nothing() -> None:
    report = reasons_report([210.0] * 5, [0.9] * 5)
    assert report.cases[0].metrics[0].verdict == "regression"


def test_a_pass_within_its_bound_needs_no_reason_but_the_runner_speed_is_shown() -> None:
    report = reasons_report([201.0] * 5, [1.0] * 5)
    table = _table(report)
    assert "(1)" not in table and "Reasons" not in render_markdown(report)
    assert "glm 1.000x" in table


def test_a_regression_gives_its_evidence_under_the_table() -> None:
    report = reasons_report([230.0] * 5, [1.0] * 5)
    table = _table(report)
    assert "regression (1)" in table
    assert "(1) glm e2e regression: median 230.000 ms > bound 206.000 ms" in table


def _confirmed(report: rep.Report, n: int) -> rep.Report:
    cases = tuple(
        dataclasses.replace(c, sampling={"reruns": n, "confirmations": n}) for c in report.cases
    )
    judgement = dataclasses.replace(report.judgement, cases=cases)
    return dataclasses.replace(report, judgement=judgement)


def test_a_case_confirmed_within_bounds_does_not_read_like_a_confirmed_regression() -> None:
    report = _confirmed(reasons_report([201.0] * 5, [1.0] * 5), 2)
    note = evidence_note(report)
    assert "glm: over a bound at first, re-measured in 2 fresh processes: within bounds" in note
    assert "confirmed" not in note
    assert "re-measured in 2 fresh processes: within bounds" in render_markdown(report)


def test_a_confirmed_regression_says_so_and_names_the_metrics() -> None:
    report = _confirmed(reasons_report([230.0] * 5, [1.0] * 5), 1)
    note = evidence_note(report)
    assert "glm: over a bound, re-measured in 1 fresh process: regression confirmed (e2e)" in note


def test_ratios_keep_three_significant_digits_of_the_change() -> None:
    assert fmt_ratio(1.104) == "1.104x"
    assert fmt_ratio(1.0) == "1.000x"
    assert fmt_ratio(0.95) == "0.950x"
    assert fmt_ratio(12.34) == "12.3x"
    report = reasons_report([230.0] * 5, [1.0] * 5)
    m = report.cases[0].metrics[0]
    m = dataclasses.replace(m, low=1.004, high=1.204, ratio=1.104)
    assert fmt_evidence(m) == "1.104x (1.004-1.204)"


TRANSFORMER = "diffusers.models.transformers.transformer_flux.FluxTransformer2DModel"


def test_a_changed_pipeline_is_named_against_the_baselines_components(tmp_path: Path) -> None:
    old = {"transformer": {"class": TRANSFORMER, "parameters": 1000}}
    new = {
        "transformer": {"class": TRANSFORMER, "parameters": 2000},
        "vae": {"class": "diffusers.AutoencoderKL", "parameters": 10},
    }
    assert component_changes(old, new) == [
        "transformer parameters 1000 -> 2000",
        "vae added (AutoencoderKL)",
    ]
    assert component_changes(old, old) == [] and component_changes(None, new) == []
    report = reasons_report([201.0] * 5, [1.0] * 5, baseline_components=old, components=new)
    expected = (
        "glm: the pipeline differs from the one the baseline measured (transformer "
        "parameters 1000 -&gt; 2000; vae added (AutoencoderKL))"
    )
    assert expected in render_markdown(report)
    assert "transformer parameters 1000 -> 2000" in _table(report)
    # The report keeps what the baseline recorded, so a re-render shows the same hint.
    path = tmp_path / "r.json"
    rep.write_report(path, report)
    data = json.loads(path.read_text())
    validate(data, "report", "r.json")
    again = rep.read_report(path)
    assert again.cases[0].component_changes == component_changes(old, new)


def test_judgement_of_unchanged_components_adds_no_hint() -> None:
    same = {"transformer": {"class": TRANSFORMER, "parameters": 1000}}
    report = reasons_report([201.0] * 5, [1.0] * 5, baseline_components=same, components=same)
    assert "differs from the one the baseline" not in render_markdown(report)
