"""Per-op time attribution: the diff of two sides' profiles, its noise rule, its
renderings, the stage timer's profiler ranges, and a real profiled pair."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
import torch
from torch.profiler import profile

from perfguard.decision.attribution import Attribution, attribute, compare_stage, stages_of
from perfguard.device.timer import StageTimer, stage, step
from perfguard.errors import PerfguardError
from perfguard.presentation.attribution import console_lines, html_section, markdown_lines
from perfguard.storage.explained import validate_attribution


def run(ops: dict[str, tuple[int, float]], stage_name: str = "DenoisingStage") -> dict:
    """One profiled run's table: op name -> (calls, self us)."""
    return {
        stage_name: [
            {"name": n, "shapes": "[[8,8]]", "calls": c, "self_us": us}
            for n, (c, us) in ops.items()
        ]
    }


BASE = [
    run({"aten::mm": (8, 1000.0), "aten::add": (8, 200.0), "aten::gelu": (4, 300.0)}),
    run({"aten::mm": (8, 1040.0), "aten::add": (8, 190.0), "aten::gelu": (4, 310.0)}),
    run({"aten::mm": (8, 980.0), "aten::add": (8, 205.0), "aten::gelu": (4, 295.0)}),
]


def test_the_op_that_got_slower_is_the_first_row_with_its_share() -> None:
    head = [
        run({"aten::mm": (12, 1510.0), "aten::add": (8, 198.0), "aten::gelu": (4, 301.0)}),
        run({"aten::mm": (12, 1490.0), "aten::add": (8, 202.0), "aten::gelu": (4, 305.0)}),
        run({"aten::mm": (12, 1530.0), "aten::add": (8, 195.0), "aten::gelu": (4, 299.0)}),
    ]
    got = compare_stage("DenoisingStage", BASE, head)
    first = got.rows[0]
    assert (first.name, first.calls_base, first.calls_head) == ("aten::mm", 8, 12)
    assert first.delta_us == pytest.approx(1510.0 - 1000.0)
    assert not first.within_noise
    assert [r.within_noise for r in got.rows[1:]] == [True, True]
    assert sum(r.share for r in got.rows if r.share is not None) == pytest.approx(1.0)
    assert got.delta_us == pytest.approx(sum(r.delta_us for r in got.rows))


def test_unchanged_code_gives_rows_all_within_noise() -> None:
    head = [BASE[1], BASE[2], BASE[0]]  # the same runs in another order: a pure A/A
    got = compare_stage("DenoisingStage", BASE, head)
    assert got.rows and all(r.within_noise for r in got.rows)
    assert all(r.share is None for r in got.rows)  # a stage that did not move has no shares


def test_a_change_inside_the_run_to_run_spread_is_noise() -> None:
    """The range of the same op over one side's runs is the noise: a change of the
    median smaller than it is not called real, a larger one is."""
    noisy = [run({"aten::mm": (8, us)}) for us in (1000.0, 1400.0, 1200.0)]
    inside = [run({"aten::mm": (8, us)}) for us in (1250.0, 1300.0, 1350.0)]
    outside = [run({"aten::mm": (8, us)}) for us in (2000.0, 2050.0, 2100.0)]
    assert compare_stage("DenoisingStage", noisy, inside).rows[0].within_noise
    assert not compare_stage("DenoisingStage", noisy, outside).rows[0].within_noise


def test_an_op_only_one_side_runs_is_a_row_of_its_own() -> None:
    head = [run({**{r["name"]: (r["calls"], r["self_us"]) for r in b["DenoisingStage"]},
                 "aten::bmm": (8, 900.0)}) for b in BASE]  # fmt: skip
    row = compare_stage("DenoisingStage", BASE, head).rows[0]
    assert (row.name, row.calls_base, row.calls_head, row.base_us) == ("aten::bmm", 0, 8, 0.0)


def test_the_stages_a_metric_names() -> None:
    assert stages_of(["stage:DecodingStage", "step_avg"]) == ["DecodingStage", "DenoisingStage"]
    assert stages_of(["e2e"]) is None
    assert stages_of([]) is None


def test_the_section_round_trips_validates_and_renders() -> None:
    head = [run({"aten::mm": (12, 1500.0 + i), "aten::add": (8, 200.0)}) for i in range(3)]
    case = attribute(
        "c<1>", BASE, head, stages=["DenoisingStage"], metrics=["stage:DenoisingStage"],
        sides={"base": {"commit": "a" * 40, "trace": "c.base.trace.json"}, "head": {}},
    )  # fmt: skip
    data = Attribution((case,), runs=3).to_json()
    validate_attribution(data, "x.json")
    again = Attribution.from_json(json.loads(json.dumps(data)))
    assert again.to_json() == data
    text = "\n".join(console_lines(data))
    assert "aten::mm" in text and "calls 8 -> 12" in text and "c.base.trace.json" in text
    md = "\n".join(markdown_lines(data))
    assert "<details>" in md and "| `aten::mm` |" in md and "c&lt;1&gt;" in md
    page = html_section(data)
    assert "<svg" in page and "<rect" in page and "c&lt;1&gt;" in page and "c<1>" not in page
    bad = json.loads(json.dumps(data))
    bad["cases"]["c<1>"]["stages"][0]["rows"][0]["calls_head"] = -1
    with pytest.raises(PerfguardError, match=r"calls_head"):
        validate_attribution(bad, "x.json")


def test_markdown_keeps_the_top_ten_rows_of_a_stage() -> None:
    many = {f"aten::op{i:02d}": (1, 100.0 + 50 * i) for i in range(15)}
    base = [run({k: (1, 100.0) for k in many})] * 3
    case = attribute("c", base, [run(many)] * 3)
    md = markdown_lines(Attribution((case,), runs=3).to_json())
    rows = [ln for ln in md if ln.startswith("| `aten::")]
    assert len(rows) == 10 and "aten::op14" in rows[0]
    assert any("5 more row(s)" in ln for ln in md)


def test_the_timer_opens_a_profiler_range_per_stage_and_step() -> None:
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with profile(activities=cpu) as prof, StageTimer(ranges=True), stage("DenoisingStage"):
        for i in range(2):
            with step(i):
                torch.mm(torch.ones(4, 4), torch.ones(4, 4))
    names = [e.name for e in prof.events()]
    assert names.count("stage:DenoisingStage") == 1
    assert names.count("step:0") == 1 and names.count("step:1") == 1
    mm = [e for e in prof.events() if e.name == "aten::mm"]
    assert mm and all(e.cpu_parent is not None for e in mm)
    with profile(activities=cpu) as plain, StageTimer(), stage("DenoisingStage"):
        torch.ones(1)
    assert not [e for e in plain.events() if e.name.startswith("stage:")]


FACTORY = textwrap.dedent(
    """
    import os
    import torch
    from perfguard.device.timer import stage, step

    def factory(case, platform):
        extra = int(os.environ.get("ATTRIBUTION_TEST_EXTRA", "0"))
        a = torch.randn(192, 192, generator=torch.Generator().manual_seed(0))

        def pipeline():
            with stage("TextEncodingStage"):
                x = torch.tanh(a)
            with stage("DenoisingStage"):
                for i in range(3):
                    with step(i):
                        x = torch.relu(x @ a)
                        for _ in range(extra):
                            torch.mm(a, a)
            return x

        return pipeline
    """
)


@pytest.mark.slow
def test_a_profiled_pair_names_the_extra_matmul_first(tmp_path: Path) -> None:
    """Two real profiled processes of a pipeline whose head does 4 extra 192x192
    products per step: `aten::mm` is the denoising stage's first row, outside noise, and
    each side's Chrome trace is written and holds the stage ranges."""
    from perfguard.measurement.explain import explain_case
    from perfguard.measurement.profiling import ProfileSide
    from perfguard.storage.cases import Case

    (tmp_path / "attr_factory.py").write_text(FACTORY, encoding="utf-8")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    case = Case(id="fake", workload="qwen_image", preset="tiny", steps=3)
    base = ProfileSide("base", env={"PYTHONPATH": path})
    head = ProfileSide("head", env={"PYTHONPATH": path, "ATTRIBUTION_TEST_EXTRA": "4"})
    got = explain_case(
        case, base, head, platform="cpu", traces_dir=tmp_path, factory="attr_factory:factory",
        metrics=["stage:DenoisingStage"],
    )  # fmt: skip
    assert got.error is None
    (stage_got,) = got.stages
    first = stage_got.rows[0]
    assert first.name == "aten::mm" and not first.within_noise
    assert (first.calls_base, first.calls_head) == (3, 15)
    trace = json.loads((tmp_path / "fake.head.trace.json").read_text(encoding="utf-8"))
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"stage:DenoisingStage", "step:0", "aten::mm"} <= names
    assert got.sides["head"]["trace"].endswith("fake.head.trace.json")


@pytest.mark.slow
def test_a_side_that_cannot_run_is_the_cases_error(tmp_path: Path) -> None:
    from perfguard.measurement.explain import explain_case
    from perfguard.measurement.profiling import ProfileSide
    from perfguard.storage.cases import Case

    case = Case(id="fake", workload="qwen_image", preset="tiny", steps=3)
    got = explain_case(
        case, ProfileSide("base"), ProfileSide("head"), platform="cpu", factory="no_such_mod:f"
    )
    assert got.error and "base's profiled run failed" in got.error and "no_such_mod" in got.error


def test_one_stretched_run_of_five_does_not_widen_the_noise() -> None:
    """From five runs a side the fastest and slowest are set aside: one run a neighbour
    stretched (x5) leaves a doubled op outside noise; with the whole range it was not."""
    base = [run({"aten::mm": (8, us)}) for us in (1000.0, 1010.0, 990.0, 1005.0, 5000.0)]
    head = [run({"aten::mm": (8, us)}) for us in (2000.0, 2010.0, 1990.0, 2005.0, 9000.0)]
    row = compare_stage("DenoisingStage", base, head).rows[0]
    assert not row.within_noise and row.noise_us < 200.0
    assert compare_stage("DenoisingStage", base[:3], head[:3]).rows[0].noise_us == pytest.approx(
        20.0 + 20.0 + 20.0
    )


def test_a_side_that_ran_slower_throughout_is_noise_and_the_op_beyond_it_is_not() -> None:
    """A neighbour's load slows every op of one side alike (here x1.8): those rows moved
    with their side's pace; the one op that moved beyond it (x3.6) is what changed."""
    ops = {f"aten::op{i}": (4, 500.0 + 100 * i) for i in range(6)}
    base = [run(ops)] * 5
    slow = {k: (c, us * 1.8) for k, (c, us) in ops.items()}
    got = compare_stage("DenoisingStage", base, [run(slow)] * 5)
    assert all(r.within_noise for r in got.rows)
    slow["aten::op0"] = (4, 500.0 * 3.6)
    got = compare_stage("DenoisingStage", base, [run(slow)] * 5)
    assert [r.name for r in got.rows if not r.within_noise] == ["aten::op0"]


def test_a_check_attributes_only_regressed_timings_and_says_why_it_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`attribute_regressions` after a stored check's verdict: a passing report comes
    back as it was (nothing profiled); a regressed one whose baseline names no revision
    this repository has gets each regressed case's reason, written and rendered."""
    from helpers import history_report

    from perfguard.api import attribute_regressions
    from perfguard.storage.cases import Case
    from perfguard.storage.reports import read_report, write_report

    case = Case(id="qwen_image_t2i_smoke", workload="qwen_image", preset="tiny")
    passing = read_report(history_report(tmp_path / "p.json", 20.0, seed=1))
    assert attribute_regressions(passing, [case], None, None, platform="cpu") is passing
    slow = read_report(history_report(tmp_path / "s.json", 40.0, seed=1))
    monkeypatch.setenv("PERFGUARD_ATTRIBUTION", "0")
    assert attribute_regressions(slow, [case], None, None, platform="cpu") is slow
    monkeypatch.delenv("PERFGUARD_ATTRIBUTION")
    got = attribute_regressions(slow, [case], None, None, platform="cpu", echo=None)
    entry = got.attribution["cases"]["qwen_image_t2i_smoke"]
    assert "stage:DenoisingStage" in entry["metrics"] and "b.json" in entry["error"]
    write_report(tmp_path / "again.json", got)
    assert read_report(tmp_path / "again.json").attribution == got.attribution
    assert any("no attribution" in line for line in console_lines(got.attribution))
