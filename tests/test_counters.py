"""The verdict on what the code does: work counters (exact, ranges, context) and output.

The end-to-end tests run `check-work` on a small hand-built pipeline
(`pipeline` below, loaded with `--factory test_counters:pipeline`), whose work a test
changes through `EXTRA`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from perfguard.decision import verdict
from perfguard.decision.counters import judge_counter, judge_work
from perfguard.decision.judgement import Judgement, contended, overall
from perfguard.decision.options import JudgeOptions
from perfguard.decision.output import (
    BIT_IDENTICAL,
    CHANGED,
    SKETCH_VALUES,
    WITHIN_TOLERANCE,
    OutputSketch,
    judge_output,
)
from perfguard.decision.records import CaseVerdict
from perfguard.decision.tolerances import default_profiles
from perfguard.decision.work_counts import WorkCounts
from perfguard.device.timer import stage, step
from perfguard.results import CaseResult

PROFILE = default_profiles("cpu")["pr_test"]


# ---- one counter ---------------------------------------------------------------------------


def test_a_counter_is_compared_exactly() -> None:
    assert judge_counter("ops:DenoisingStage", (101, 101), (100, 100), 0, 0).verdict == "regression"
    assert judge_counter("ops:DenoisingStage", (100, 100), (100, 100), 0, 0).verdict == "pass"
    shrunk = judge_counter("ops:DenoisingStage", (99, 99), (100, 100), 0, 0)
    assert shrunk.verdict == "improvement" and "-1" in shrunk.reason


def test_a_counter_that_varies_is_judged_on_its_range() -> None:
    base = (10, 14)  # data-dependent control flow: the baseline's runs counted 10..14
    assert judge_counter("syncs", (13, 13), base, 0, 0).verdict == "pass"
    assert judge_counter("syncs", (10, 14), base, 0, 0).verdict == "pass"
    assert judge_counter("syncs", (12, 15), base, 0, 0).verdict == "regression"
    assert judge_counter("syncs", (9, 9), base, 0, 0).verdict == "improvement"


def test_a_profile_or_a_case_can_give_a_counter_class_a_tolerance() -> None:
    current = WorkCounts({"alloc:DecodingStage": (105, 105), "ops:DecodingStage": (11, 11)})
    base = WorkCounts({"alloc:DecodingStage": (100, 100), "ops:DecodingStage": (10, 10)})
    exact = judge_work(current, base, PROFILE)
    assert {m.metric: m.verdict for m in exact.metrics} == {
        "alloc:DecodingStage": "regression",
        "ops:DecodingStage": "regression",
    }
    loose = judge_work(
        current, base, PROFILE, [{"alloc": {"rel": 0.1}, "ops:DecodingStage": {"abs": 1}}]
    )
    assert all(m.verdict == "pass" for m in loose.metrics)


def test_counts_of_another_torch_or_device_are_not_compared() -> None:
    ctx = {"torch": "2.13.0+cpu", "device_type": "cpu", "dtype": "float32"}
    base = WorkCounts({"ops": (10, 10)}, context=ctx)
    newer = WorkCounts({"ops": (99, 99)}, context={**ctx, "torch": "2.14.0+cpu"})
    judged = judge_work(newer, base, PROFILE)
    assert judged.metrics == ()
    assert judged.note and "torch 2.13.0+cpu -> 2.14.0+cpu" in judged.note
    assert "gen-baselines" in judged.note and "timings still judged" in judged.note
    cuda = WorkCounts({"ops": (10, 10)}, context={**ctx, "device_type": "cuda"})
    assert judge_work(cuda, base, PROFILE).note is not None


def test_a_baseline_without_counters_or_a_run_without_them_says_so() -> None:
    counts = WorkCounts({"ops": (10, 10)})
    assert "gen-baselines" in (judge_work(counts, None, PROFILE).note or "")
    missing = judge_work(None, counts, PROFILE, why_missing="the pipeline failed under the mode")
    assert missing.metrics == () and "failed under the mode" in (missing.note or "")


def _run(ops: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    stages = {
        "TextEncodingStage": {"ops": 4, "flops": 100, "alloc": 64, "syncs": 0},
        "DenoisingStage": {"ops": ops, "flops": 800, "alloc": 512, "syncs": 2},
    }
    return {
        "context": {"torch": "t", "device_type": "cpu", "dtype": "float32"},
        "total": {"ops": 4 + ops, "flops": 900, "alloc": 576, "syncs": 2},
        "stages": stages,
        "steps": [{"ops": ops // 2, "flops": 400, "alloc": 256, "syncs": 1}] * 2,
        "op_counts": {"DenoisingStage": {"aten::addmm": ops}},
        "sync_ops": {"DenoisingStage": {"aten::nonzero": 2}},
        **(extra or {}),
    }


def test_counts_over_several_runs_keep_their_range_and_round_trip() -> None:
    counts = WorkCounts.from_runs([_run(8), _run(10), _run(8)])
    assert counts is not None and counts.runs == 3
    assert counts.counters["ops:DenoisingStage"] == (8, 10)
    assert counts.varies == ["ops", "ops_per_step", "ops:DenoisingStage"]
    data = counts.to_json()
    assert data["stages"]["DenoisingStage"]["ops"] == [8, 10]
    assert data["stages"]["DenoisingStage"]["flops"] == 800
    assert WorkCounts.from_json(data) == counts


def test_flops_a_formula_could_not_count_are_left_out_not_passed() -> None:
    counts = WorkCounts.from_runs([_run(8, {"uncounted_flops": ["aten::weird"]})])
    assert counts is not None and not any(m.startswith("flops") for m in counts.counters)
    assert counts.uncounted and "aten::weird" in counts.uncounted


# ---- the case verdict ----------------------------------------------------------------------


def _result(ops: int, output: float = 1.0) -> CaseResult:
    samples = {"e2e": [10.0, 10.1, 9.9, 10.0, 10.05], "stage:DenoisingStage": [5.0] * 5}
    out = torch.full((2, 3), output)
    from perfguard.measurement.runner import output_sketch, tensor_hash

    return CaseResult(
        case_id="c",
        samples=samples,
        repeats=5,
        work=[_run(ops)],
        output_hash=tensor_hash(out),
        output_sketch=output_sketch(out),
    )


def _scenario(ops: int = 8) -> Any:
    from perfguard.storage.refresh import scenario_from_result

    return scenario_from_result(_result(ops))


def test_more_work_is_a_regression_whatever_the_timings_say() -> None:
    case = verdict.judge_case("c", _result(10), _scenario(8), PROFILE)
    by = {m.metric: m for m in case.metrics}
    assert by["e2e"].verdict == "pass"  # the same times
    assert by["ops:DenoisingStage"].verdict == "regression"
    assert by["ops:DenoisingStage"].to_json()["delta"] == 2
    assert case.verdict == "regression"
    assert overall([case]) == ("fail", 1)
    # The gate confirms timings in fresh processes, not counts: a count cannot change.
    assert "ops:DenoisingStage" not in case.over
    # A busy runner does not excuse more work.
    busy = contended(case, "the runner was contended")
    assert busy.verdict == "regression" and overall([busy])[1] == 1


def test_less_work_is_an_improvement_never_a_failure() -> None:
    case = verdict.judge_case("c", _result(6), _scenario(8), PROFILE)
    by = {m.metric: m.verdict for m in case.metrics}
    assert by["ops:DenoisingStage"] == "improvement"
    assert overall([case]) == ("pass", 0)


def test_a_changed_output_fails_unless_allowed() -> None:
    case = verdict.judge_case("c", _result(8, output=1.5), _scenario(8), PROFILE)
    assert case.output is not None and case.output["verdict"] == CHANGED
    assert case.output_failed and overall([case])[1] == 1
    allowed = verdict.judge_case(
        "c",
        _result(8, output=1.5),
        _scenario(8),
        PROFILE,
        judging=JudgeOptions(allow_output_change=True),
    )
    assert not allowed.output_failed and overall([allowed])[1] == 0
    same = verdict.judge_case("c", _result(8), _scenario(8), PROFILE)
    assert same.output == {"verdict": BIT_IDENTICAL, "allowed": False}
    again = CaseVerdict.from_json("c", case.to_json())
    assert again.output_failed and again.work == case.work


# ---- output equivalence --------------------------------------------------------------------


def _sketch(t: torch.Tensor) -> OutputSketch:
    from perfguard.measurement.runner import output_sketch

    return OutputSketch.from_json(output_sketch(t))


def test_output_is_bit_identical_within_tolerance_or_changed() -> None:
    torch.manual_seed(0)
    image = torch.rand(1, 3, 32, 32)
    ref = _sketch(image)
    assert judge_output("a", ref, "a", ref).verdict == BIT_IDENTICAL
    reassociated = image + 1e-7 * torch.randn_like(image)
    near = judge_output("b", _sketch(reassociated), "a", ref)
    assert near.verdict == WITHIN_TOLERANCE and near.psnr_db and near.psnr_db > 120
    bf16 = image.to(torch.bfloat16).to(torch.float32)
    low = judge_output("c", _sketch(bf16), "a", ref)
    assert low.verdict == CHANGED and low.failed
    assert low.psnr_db is not None and 50 < low.psnr_db < 70  # one bf16 rounding: ~60 dB
    assert low.max_abs_diff is not None and 0 < low.max_abs_diff < 0.01
    assert "PSNR" in low.reason
    assert not judge_output("c", _sketch(bf16), "a", ref, allowed=True).failed
    other_shape = judge_output("d", _sketch(torch.rand(1, 3, 16, 16)), "a", ref)
    assert other_shape.verdict == CHANGED and "shape" in other_shape.reason
    assert judge_output(None, None, "a", ref) is None


def test_a_sketch_round_trips_exactly() -> None:
    sketch = _sketch(torch.rand(2, 3, 100, 90))
    assert OutputSketch.from_json(sketch.to_json()) == sketch
    assert math.prod(sketch.sketch_shape) <= SKETCH_VALUES and not sketch.exact


# ---- end to end: check-work ---------------------------------------------------------------

EXTRA: dict[str, Any] = {}


def pipeline(case: Any, platform: Any) -> Callable[[], torch.Tensor]:
    """A staged pipeline whose work the tests change through `EXTRA`."""
    torch.manual_seed(case.seed)
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8)

    def run() -> torch.Tensor:
        with torch.inference_mode():
            with stage("TextEncodingStage"):
                y = lin(x)
                if EXTRA.get("linear"):
                    y = lin(y)
            with stage("DenoisingStage"):
                for i in range(2):
                    with step(i):
                        y = y * 0.5
                        if EXTRA.get("sync"):
                            torch.nonzero(y > 0)
            with stage("DecodingStage"):
                return y * EXTRA.get("scale", 1.0)

    return run


CASES = """
[[case]]
id = "tiny"
workload = "qwen_image"
preset = "tiny"
tags = ["smoke"]
"""


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg: Any) -> Iterator[Any]:
    EXTRA.clear()
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "common.toml").write_text(CASES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    base = tmp_path / "b.json"
    common = ("--cases", "cases", "--baseline", str(base), "--factory", "test_counters:pipeline")
    # In this process: worker processes would not find this test module.
    code, out, err = pg(
        "gen-baselines", *common, "--repeats", "2", "--warmup", "1", "--processes", "1"
    )
    assert code == 0, out + err

    def check(*more: str) -> tuple[int, str, str, dict[str, Any]]:
        report = tmp_path / "r.json"
        report.unlink(missing_ok=True)
        args = ("check-work", *common, "--report", str(report), *more)
        code, out, err = pg(*args, "--markdown", str(tmp_path / "r.md"))
        data = json.loads(report.read_text()) if report.exists() else {}
        return code, out + (tmp_path / "r.md").read_text() if report.exists() else out, err, data

    yield base, check
    EXTRA.clear()


def test_unchanged_code_passes_the_counters_only_check(setup: Any) -> None:
    base, check = setup
    stored = json.loads(base.read_text())["scenarios"]["tiny"]
    assert stored["work"]["stages"]["TextEncodingStage"] == {
        "alloc": 64,
        "flops": 256,
        "ops": 2,
        "syncs": 0,
    }
    results = base.with_name("results.json")
    code, text, err, report = check("--out", str(results))
    assert code == 0, text + err
    stored_results = json.loads(results.read_text())["cases"]["tiny"]  # schema-valid
    assert stored_results["repeats"] == 0 and stored_results["work"][0]["stages"]
    case = report["cases"]["tiny"]
    assert case["output"]["verdict"] == BIT_IDENTICAL
    assert case["metrics"]["ops:TextEncodingStage"]["delta"] == 0
    assert not any(m.startswith("stage:") for m in case["metrics"])  # nothing timed


def test_the_check_names_the_stage_and_counter_that_grew(setup: Any) -> None:
    _, check = setup
    EXTRA["linear"] = True
    code, text, _, report = check("--allow-output-change")
    assert code == 1
    metrics = report["cases"]["tiny"]["metrics"]
    assert metrics["ops:TextEncodingStage"]["verdict"] == "regression"
    assert metrics["ops:TextEncodingStage"]["delta"] == 2
    assert metrics["flops:TextEncodingStage"]["delta"] == 256
    assert metrics["ops:DenoisingStage"]["verdict"] == "pass"
    assert "TextEncodingStage: +1 `aten::addmm`, +1 `aten::t`" in text
    assert report["cases"]["tiny"]["work"]["op_changes"]["TextEncodingStage"]["aten::addmm"] == [
        1,
        2,
    ]


def test_a_new_host_sync_per_step_is_named(setup: Any) -> None:
    _, check = setup
    EXTRA["sync"] = True
    code, text, _, _ = check()
    assert code == 1
    assert "+1 host sync per step (`aten::nonzero` +1)" in text


def test_a_changed_output_fails_the_check_unless_the_command_allows_it(setup: Any) -> None:
    _, check = setup
    EXTRA["scale"] = 1.001
    code, text, _, report = check()
    assert code == 1 and report["cases"]["tiny"]["output"]["verdict"] == CHANGED
    assert "output changed in 1 case(s)" in text
    code, _, _, report = check("--allow-output-change")
    assert code == 0 and report["cases"]["tiny"]["output"]["allowed"] is True


def test_counts_from_another_torch_are_a_data_error_not_a_pass(setup: Any) -> None:
    """The work check judges counts only: against counts of another torch it would
    compare nothing and pass, so it refuses before running (exit 2, one line)."""
    base, check = setup
    data = json.loads(base.read_text())
    data["scenarios"]["tiny"]["work"]["context"]["torch"] = "2.4.0"
    data["scenarios"]["tiny"]["work"]["stages"]["TextEncodingStage"]["ops"] = 1
    base.write_text(json.dumps(data))
    code, _, err, report = check()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and report == {} and len(lines) == 1, err
    assert "'tiny'" in lines[0] and "torch 2.4.0 (here " in lines[0], err
    assert "would compare nothing" in lines[0]


@pytest.mark.parametrize(
    ("value", "where"),
    [
        (-1, "stages.TextEncodingStage.ops"),
        (1.5, "stages.TextEncodingStage.ops"),
        ("2", "stages.TextEncodingStage.ops"),
        (None, "stages.DecodingStage.syncs"),  # missing from one stage of three
    ],
)
def test_a_bad_counter_in_a_baseline_is_exit_2_naming_file_case_and_field(
    setup: Any, value: Any, where: str
) -> None:
    base, check = setup
    data = json.loads(base.read_text())
    stages = data["scenarios"]["tiny"]["work"]["stages"]
    if value is None:
        del stages["DecodingStage"]["syncs"]
    else:
        stages["TextEncodingStage"]["ops"] = value
    base.write_text(json.dumps(data))
    before = base.read_bytes()
    code, _, err, _ = check()
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert str(base) in line and "scenarios.tiny.work." + where in line
    assert base.read_bytes() == before


def test_baselines_diff_lists_every_counter_that_moved(setup: Any, pg: Any) -> None:
    base, _ = setup
    data = json.loads(base.read_text())
    stages = data["scenarios"]["tiny"]["work"]["stages"]
    stages["TextEncodingStage"]["ops"] += 3
    stages["DecodingStage"]["alloc"] = max(0, stages["DecodingStage"]["alloc"] - 8)
    newer = base.with_name("new.json")
    newer.write_text(json.dumps(data))
    code, out, err = pg("baselines", "diff", str(base), str(newer), "--format", "json")
    assert code == 0, err
    rows = {r["metric"]: r for r in json.loads(out)["changed"]}
    assert rows["ops:TextEncodingStage"]["change"] == "slower"  # more work
    assert rows["ops:TextEncodingStage"]["new"] - rows["ops:TextEncodingStage"]["old"] == 3
    assert rows["alloc:DecodingStage"]["change"] == "faster"
    data["scenarios"]["tiny"]["work"]["context"]["torch"] = "9.9"
    newer.write_text(json.dumps(data))
    code, out, _ = pg("baselines", "diff", str(base), str(newer), "--format", "json")
    rows = {r["metric"]: r for r in json.loads(out)["changed"]}
    assert rows["ops:TextEncodingStage"]["change"] == "unknown"


def test_baselines_merge_keeps_the_counts(setup: Any, pg: Any) -> None:
    base, _ = setup
    merged = base.with_name("merged.json")
    code, _, err = pg("baselines", "merge", str(base), "--out", str(merged))
    assert code == 0, err
    work = json.loads(merged.read_text())["scenarios"]["tiny"]["work"]
    assert work == json.loads(base.read_text())["scenarios"]["tiny"]["work"]


def test_the_relative_check_gives_the_exact_counter_delta_between_base_and_head() -> None:
    from perfguard.decision.paired import BASE, HEAD, Block, LookLevels, judge_blocks

    def side(ops: int) -> CaseResult:
        res = _result(ops)
        res.samples = {"e2e": [10.0, 10.2, 9.8]}
        res.repeats = 3
        return res

    blocks = [Block("BH", 1.0, {BASE: {"c": side(8)}, HEAD: {"c": side(10)}}) for _ in range(2)]
    judgement, _ = judge_blocks(["c"], blocks, levels=LookLevels(0.01, (2,)), final=True)
    (case,) = judgement.cases
    by = {m.metric: m for m in case.metrics}
    assert by["ops:DenoisingStage"].verdict == "regression"
    assert by["ops:DenoisingStage"].to_json()["delta"] == 2
    assert case.output is not None and case.output["verdict"] == BIT_IDENTICAL
    assert judgement.exit_code == 1


def test_a_bad_counter_in_a_results_file_is_exit_2_naming_it(setup: Any, pg: Any) -> None:
    base, _ = setup
    results = base.with_name("results.json")
    common = ("--cases", "cases", "--factory", "test_counters:pipeline")
    code, _, err = pg("run", *common, "--repeats", "1", "--warmup", "0", "--out", str(results))
    assert code == 0, err
    data = json.loads(results.read_text())
    data["cases"]["tiny"]["work"][0]["stages"]["DenoisingStage"]["syncs"] = "1"
    results.write_text(json.dumps(data))
    code, _, err = pg("judge", "--results", str(results), "--baseline", str(base))
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert str(results) in line and "cases.tiny.work[0].stages.DenoisingStage.syncs" in line


def test_the_markdown_opens_with_the_work_and_escapes_what_came_from_files() -> None:
    import dataclasses

    from perfguard.presentation.markdown import render_markdown
    from perfguard.storage.reports import build

    case = verdict.judge_case("c", _result(10), _scenario(8), PROFILE)
    hostile = dataclasses.replace(case, case_id="<b>x</b>|[y](z)")
    judgement = Judgement("pr_test", (hostile,))
    report = build(
        judgement,
        environment={"platform": "cpu", "hardware": "h"},
        baseline_info={"path": "b.json"},
        profile={},
        settings={},
        improvement_threshold=0.2,
    )
    md = render_markdown(report)
    work_at = md.index("#### What the code does")
    assert work_at < md.index("<details>")
    assert "DenoisingStage: +1 `aten::addmm` per step" in md
    assert "<b>x</b>" not in md and "&lt;b&gt;x&lt;/b&gt;" in md
    # The timing tables leave the counters out; the JSON keeps every one.
    assert "ops:DenoisingStage" not in md
    assert "ops:DenoisingStage" in report.to_json()["cases"]["<b>x</b>|[y](z)"]["metrics"]


def test_baselines_show_prints_the_work_counters_per_stage(setup: Any, pg: Any) -> None:
    base, _ = setup
    code, out, err = pg("baselines", "show", str(base))
    assert code == 0, err
    assert "tiny: work counters" in out
    table = out.split("tiny: work counters")[1]
    rows = {r.split("│")[1].strip(): r.split("│")[2:6] for r in table.splitlines() if "│" in r}
    assert [c.strip() for c in rows["TextEncodingStage"]] == ["2", "256", "64", "0"]
