"""`run`, `gen-baselines`, `check`, `baselines ...`, `report render`, `merge` end to end.

Most tests run fake pipelines on a virtual clock: each stage advances the clock the
timer reads by a set number of milliseconds, so figures are exact and the suite does not
depend on how busy the machine is. The last tests run the real smoke pipelines.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from perfguard.device.platform import Platform
from perfguard.storage.jsonio import validate
from tests.fake_pipeline import (
    BEHAVIOUR,
    CHECK,
    GEN,
    REPO,
)
from tests.helpers import PG


def report_of(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    validate(data, "report", str(path))
    return data


# ---- gen-baselines then check --------------------------------------------------------------


def test_gen_baselines_then_check_passes_and_writes_every_output(
    fake: Path, pg: PG, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = pg(*GEN)
    assert code == 0 and "updated 2 of 2 case(s)" in out
    assert pg("baselines", "validate", str(fake))[0] == 0
    summary = tmp_path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, err = pg(*CHECK, "--report", "r.json", "--markdown", "r.md")
    assert code == 0, out + err
    assert "perfguard PASS" in out
    report = report_of(tmp_path / "r.json")
    assert report["verdict"] == "pass" and report["settings"]["inject"] is None
    assert report["settings"]["start_method"] == "forkserver"  # Linux's default
    assert report["baseline"]["path"] == "baselines/cpu/test-cpu.json"
    metrics = report["cases"]["alpha"]["metrics"]
    assert metrics["stage:DenoisingStage"]["baseline"]["median"] == pytest.approx(41.0, abs=0.5)
    assert (tmp_path / "r.md").read_text().startswith("### ✅ perfguard PASS")
    assert summary.read_text() == (tmp_path / "r.md").read_text()


def test_a_slowed_stage_fails_the_check_naming_that_stage_first(fake: Path, pg: PG) -> None:
    pg(*GEN)
    BEHAVIOUR.slow["DecodingStage"] = 3.0  # 4 ms -> 12 ms, and e2e 48 -> 56 ms
    code, out, _ = pg(*CHECK, "--report", "r.json")
    assert code == 1
    rows = [line for line in out.splitlines() if "│" in line]
    regressions = [r for r in rows if "regression" in r]
    assert rows[: len(regressions)] == regressions  # regressions come first
    assert any("stage:DecodingStage" in r for r in regressions)
    verdicts = report_of(Path("r.json"))["cases"]["alpha"]["metrics"]
    assert verdicts["stage:DecodingStage"]["verdict"] == "regression"
    assert verdicts["stage:TextEncodingStage"]["verdict"] == "pass"


def test_check_injects_a_real_slowdown_and_records_it_in_the_report(fake: Path, pg: PG) -> None:
    pg(*GEN)
    code, _, _ = pg(
        *CHECK, "--case", "alpha", "--inject", "DenoisingStage=+60%", "--report", "r.json"
    )
    assert code == 1
    report = report_of(Path("r.json"))
    assert report["settings"]["inject"] == "DenoisingStage=+60%"
    assert report["cases"]["alpha"]["metrics"]["stage:DenoisingStage"]["verdict"] == "regression"


def test_a_case_that_fails_to_run_exits_3_and_the_others_are_still_judged(
    fake: Path, pg: PG
) -> None:
    pg(*GEN)
    BEHAVIOUR.raises.add("beta")
    code, _, _ = pg(*CHECK, "--report", "r.json")
    assert code == 3
    report = report_of(Path("r.json"))
    assert report["cases"]["beta"]["verdict"] == "error"
    assert "out of memory" in report["cases"]["beta"]["error"]
    assert report["cases"]["alpha"]["verdict"] == "pass"
    BEHAVIOUR.slow["step"] = 2.0
    assert pg(*CHECK)[0] == 1  # a regression outranks a failed case


def test_missing_baselines_and_stages_pass_unless_fail_on_missing(fake: Path, pg: PG) -> None:
    pg(*GEN, "--case", "alpha")
    BEHAVIOUR.skip_stage.add("DecodingStage")
    code, out, _ = pg(*CHECK, "--report", "r.json")
    assert code == 0, out
    cases = report_of(Path("r.json"))["cases"]
    assert cases["beta"]["verdict"] == "missing-baseline"
    assert cases["alpha"]["metrics"]["stage:DecodingStage"]["verdict"] == "missing-stage"
    assert pg(*CHECK, "--fail-on-missing")[0] == 1


def test_advisory_reports_regressions_without_failing(fake: Path, pg: PG) -> None:
    pg(*GEN)
    BEHAVIOUR.slow["step"] = 2.0
    code, out, _ = pg(*CHECK, "--advisory", "--report", "r.json")
    assert code == 0 and "advisory: not enforced" in out
    # The regressions are in the report, metric by metric (`counts > 0` alone held for a
    # report that flagged any metric at all, e.g. a spurious one).
    for data in (report_of(Path("r.json")),):
        for case in ("alpha", "beta"):
            assert data["cases"][case]["metrics"]["stage:DenoisingStage"]["verdict"] == "regression"
            assert data["cases"][case]["metrics"]["stage:DecodingStage"]["verdict"] == "pass"
    data = json.loads(fake.read_text())
    data["metadata"]["advisory"] = True
    fake.write_text(json.dumps(data))
    assert pg(*CHECK, "--report", "r2.json")[0] == 0
    again = report_of(Path("r2.json"))
    # Advisory: the verdict is "pass" (exit 0) and every regression is still reported.
    assert again["verdict"] == "pass" and again["settings"]["advisory"] is True
    assert again["counts"]["regression"] == report_of(Path("r.json"))["counts"]["regression"]
    assert again["cases"]["alpha"]["metrics"]["stage:DenoisingStage"]["verdict"] == "regression"


def test_check_profile_must_exist_in_the_baseline(fake: Path, pg: PG) -> None:
    pg(*GEN)
    code, _, err = pg(*CHECK, "--profile", "nightly")
    assert code == 2 and "no tolerance profile 'nightly'" in err
    assert pg(*CHECK, "--profile", "long_term")[0] == 0


def test_the_confirmation_gap_is_an_option_a_setting_and_never_negative(
    fake: Path, pg: PG, monkeypatch: pytest.MonkeyPatch
) -> None:
    pg(*GEN)
    code, _, err = pg(*CHECK, "--confirm-gap-s", "-1", "--report", "r.json")
    assert code == 2 and "--confirm-gap-s" in err and not Path("r.json").exists()
    assert pg(*CHECK, "--confirm-gap-s", "0.25", "--report", "r.json")[0] == 0
    assert report_of(Path("r.json"))["settings"]["confirm_gap_s"] == 0.25
    monkeypatch.setenv("PERFGUARD_CONFIRM_GAP_S", "1.5")  # the runner's setting
    assert pg(*CHECK, "--report", "r.json")[0] == 0
    assert report_of(Path("r.json"))["settings"]["confirm_gap_s"] == 1.5


def test_alpha_is_an_option_a_setting_and_stays_inside_zero_to_a_half(
    fake: Path, pg: PG, monkeypatch: pytest.MonkeyPatch
) -> None:
    pg(*GEN)
    for bad in ("0", "0.5", "-0.01", "x"):
        code, _, err = pg(*CHECK, "--alpha", bad, "--report", "r.json")
        assert code == 2 and "--alpha" in err and not Path("r.json").exists()
    assert pg(*CHECK, "--report", "r.json")[0] == 0
    assert report_of(Path("r.json"))["settings"]["alpha"] == 0.001  # the stored default
    assert pg(*CHECK, "--alpha", "0.002", "--report", "r.json")[0] == 0
    assert report_of(Path("r.json"))["settings"]["alpha"] == 0.002
    monkeypatch.setenv("PERFGUARD_ALPHA", "0.004")  # the runner's setting
    assert pg(*CHECK, "--report", "r.json")[0] == 0
    assert report_of(Path("r.json"))["settings"]["alpha"] == 0.004


def test_check_without_a_baseline_file_says_how_to_make_one(fake: Path, pg: PG) -> None:
    code, _, err = pg(*CHECK)
    assert code == 2 and "perfguard gen-baselines" in err and err.count("\n") == 1


# ---- gen-baselines details -----------------------------------------------------------------


def test_an_injection_that_matched_no_stage_is_a_one_line_usage_error(fake: Path, pg: PG) -> None:
    pg(*GEN)
    code, out, err = pg(*CHECK, "--inject", "DenoisingStep=+60%", "--report", "r.json")
    assert code == 2, out + err
    (line,) = err.strip().splitlines()
    assert line.endswith(
        "error: inject DenoisingStep=+60%: no stage named DenoisingStep ran; stages that ran: "
        "InputValidationStage, TextEncodingStage, DenoisingStage, DecodingStage"
    )
    assert not Path("r.json").exists()  # no report that claims an injection was made


def test_gen_baselines_timing_is_a_choice_and_a_run_without_reference_times_is_stored_raw(
    fake: Path, pg: PG
) -> None:
    code, _, err = pg(*GEN, "--timing", "scaled")
    assert code == 2 and "--timing" in err and not Path("baselines").exists()
    code, out, err = pg(*GEN, "--timing", "normalized")
    assert code == 0, out + err
    # The fake pipelines' virtual clock gives the reference workload no time: nothing to
    # normalize by, so the file says its figures are raw instead of pretending.
    (path,) = Path("baselines").rglob("*.json")
    scenarios = json.loads(path.read_text())["scenarios"]
    assert {s["timing"] for s in scenarios.values()} == {"raw"}


def test_gen_baselines_refuses_injection_and_leaves_the_file_byte_identical(
    fake: Path, pg: PG, monkeypatch: pytest.MonkeyPatch
) -> None:
    pg(*GEN)
    before = fake.read_bytes()
    code, _, err = pg(*GEN, "--inject", "DenoisingStage=+10%")
    assert code == 2 and "refuses fault injection (--inject" in err
    monkeypatch.setenv("PERFGUARD_INJECT", "DenoisingStage=+10%")
    code, _, err = pg(*GEN)
    assert code == 2 and "$PERFGUARD_INJECT" in err
    assert fake.read_bytes() == before


@pytest.mark.parametrize("damage", ["", '{"kind": "perfguard.baseline", "meta', "[]", "{}"])
def test_gen_baselines_refuses_a_baseline_it_cannot_read(fake: Path, pg: PG, damage: str) -> None:
    fake.parent.mkdir(parents=True)
    fake.write_text(damage)
    code, out, err = pg(*GEN)
    assert code == 2 and str(fake.relative_to(Path.cwd())) in err
    assert "saved" not in out
    assert fake.read_text() == damage


def test_gen_baselines_saves_after_each_case_so_an_interrupt_keeps_the_done_ones(
    fake: Path, pg: PG
) -> None:
    BEHAVIOUR.interrupt.add("beta")
    code, _, _ = pg(*GEN)
    assert code == 130
    assert set(json.loads(fake.read_text())["scenarios"]) == {"alpha"}


def test_gen_baselines_updates_only_the_selection_keeps_notes_and_prunes(
    fake: Path, pg: PG, tmp_path: Path
) -> None:
    pg(*GEN)
    data = json.loads(fake.read_text())
    data["scenarios"]["alpha"]["notes"] = "keep me"
    data["scenarios"]["old"] = data["scenarios"]["beta"]
    fake.write_text(json.dumps(data))
    beta_before = json.dumps(data["scenarios"]["beta"], sort_keys=True)
    BEHAVIOUR.slow["step"] = 2.0
    assert pg(*GEN, "--case", "alpha")[0] == 0
    after = json.loads(fake.read_text())["scenarios"]
    assert after["alpha"]["notes"] == "keep me"
    assert after["alpha"]["step_avg"]["median"] == pytest.approx(20.0, abs=0.5)
    assert json.dumps(after["beta"], sort_keys=True) == beta_before
    assert "old" in after
    code, out, _ = pg(*GEN, "--case", "alpha", "--prune")
    assert code == 0 and "pruned 1 scenario(s): old" in out
    assert set(json.loads(fake.read_text())["scenarios"]) == {"alpha", "beta"}


def test_gen_baselines_tighten_only_ever_lowers_figures(fake: Path, pg: PG) -> None:
    pg(*GEN)
    before = json.loads(fake.read_text())["scenarios"]["alpha"]
    BEHAVIOUR.slow.update({"step": 2.0, "TextEncodingStage": 0.5})
    assert pg(*GEN, "--tighten")[0] == 0
    after = json.loads(fake.read_text())["scenarios"]["alpha"]
    assert after["step_avg"] == before["step_avg"]
    assert after["stages"]["TextEncodingStage"]["median"] == pytest.approx(1.5, abs=0.3)


# ---- run and check --results ---------------------------------------------------------------


def test_run_writes_results_that_check_reads_on_another_machine(fake: Path, pg: PG) -> None:
    pg(*GEN)
    code, out, _ = pg("run", "--repeats", "2", "--warmup", "0", "--out", "res.json")
    assert code == 0 and "results written to res.json" in out
    data = json.loads(Path("res.json").read_text())
    assert len(data["cases"]["alpha"]["samples"]["step:3"]) == 2
    code, out, _ = pg("judge", "--results", "res.json", "--report", "r.json")
    assert code == 0, out
    assert report_of(Path("r.json"))["settings"]["source"] == "results"
    assert pg("judge", "--results", "res.json", "--case", "beta")[0] == 0


def test_run_exits_3_when_a_case_fails(fake: Path, pg: PG) -> None:
    BEHAVIOUR.raises.add("alpha")
    code, out, _ = pg("run", "--repeats", "1", "--warmup", "0")
    assert code == 3 and "out of memory" in out


def _results(pg: PG) -> dict[str, Any]:
    pg(*GEN)
    pg("run", "--repeats", "2", "--warmup", "0", "--out", "res.json")
    return json.loads(Path("res.json").read_text())


def test_results_from_another_platform_are_a_usage_error(fake: Path, pg: PG) -> None:
    data = _results(pg)
    data["environment"]["platform"] = "cuda"
    Path("res.json").write_text(json.dumps(data))
    before = fake.read_bytes()
    code, _, err = pg("judge", "--results", "res.json", "--baseline", str(fake))
    assert code == 2 and "from platform 'cuda'" in err and err.count("\n") == 1
    assert fake.read_bytes() == before


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace('"e2e": [', '"e2e": [NaN, '), "NaN is not a valid number"),
        (lambda t: t.replace('"e2e": [', '"e2e": [1e400, '), "samples.e2e[0]"),
        (lambda t: t.replace('"e2e": [', '"e2e": [-4.0, '), "samples.e2e[0]"),
        (lambda t: t.replace('"e2e": [', '"e2e": ["4", '), "samples.e2e[0]"),
        (
            lambda t: t.replace('"e2e": [', '"latency": [1.0], "e2e": ['),
            "samples: 'latency' does not match",
        ),
        (lambda t: "", "empty file"),
        (lambda t: t[: len(t) // 2], "malformed JSON"),
        (lambda t: "[]", "expected a JSON object"),
    ],
)
def test_bad_results_files_exit_2_with_one_line_and_the_baseline_untouched(
    fake: Path, pg: PG, edit: Callable[[str], str], message: str
) -> None:
    _results(pg)
    path = Path("res.json")
    path.write_text(edit(json.dumps(json.loads(path.read_text()), sort_keys=True)))
    before = fake.read_bytes()
    code, _, err = pg("judge", "--results", "res.json", "--baseline", str(fake))
    assert code == 2
    assert message in err and err.count("\n") == 1 and "res.json" in err
    assert fake.read_bytes() == before


# ---- merge, render, baselines commands -----------------------------------------------------


def test_merge_combines_shard_reports_and_exits_with_the_merged_code(fake: Path, pg: PG) -> None:
    pg(*GEN)
    assert pg(*CHECK, "--case", "alpha", "--report", "a.json")[0] == 0
    BEHAVIOUR.slow["step"] = 2.0
    assert pg(*CHECK, "--case", "beta", "--report", "b.json")[0] == 1
    code, out, _ = pg("merge", "a.json", "b.json", "--out", "m.json", "--markdown", "m.md")
    assert code == 1 and "FAIL" in out
    merged = report_of(Path("m.json"))
    assert sorted(merged["cases"]) == ["alpha", "beta"]
    assert "merged from 2 shard(s)" in Path("m.md").read_text()
    code, _, err = pg("merge", "a.json", "a.json", "--out", "x.json")
    assert code == 2 and "in both" in err


def test_report_render_formats(fake: Path, pg: PG) -> None:
    pg(*GEN)
    pg(*CHECK, "--report", "r.json", "--markdown", "r.md")
    assert pg("report", "render", "r.json")[1] == Path("r.md").read_text()
    assert json.loads(pg("report", "render", "r.json", "--format", "json")[1])["verdict"] == "pass"
    code, out, _ = pg("report", "render", "r.json", "--format", "table", "--all-metrics")
    assert code == 0 and "step:3" in out
    Path("bad.json").write_text('{"kind": "perfguard.report"}')
    code, _, err = pg("report", "render", "bad.json")
    assert code == 2 and "bad.json: $" in err


def test_baselines_show_and_diff(fake: Path, pg: PG) -> None:
    pg(*GEN)
    other = fake.with_name("other.json")
    other.write_bytes(fake.read_bytes())
    BEHAVIOUR.slow["step"] = 2.0
    pg(*GEN, "--baseline", str(other), "--case", "alpha")
    code, out, _ = pg("baselines", "show", str(fake), "--case", "alpha")
    assert code == 0 and "stage:DenoisingStage" in out and "pr_test" in out
    shown = json.loads(pg("baselines", "show", str(fake), "--case", "alpha", "--json")[1])
    assert shown["stages"]["DenoisingStage"]["n"] == 3
    code, out, _ = pg("baselines", "diff", str(fake), str(other))
    assert code == 0 and "step_avg" in out and "2.000" in out
    diff = json.loads(pg("baselines", "diff", str(fake), str(other), "--json")[1])
    assert {r["case"] for r in diff["changed"]} == {"alpha"}


def test_baselines_validate_reports_each_file_and_exits_2_if_any_is_bad(fake: Path, pg: PG) -> None:
    pg(*GEN)
    Path("bad.json").write_text("{")
    code, out, err = pg("baselines", "validate", str(fake), "bad.json")
    assert code == 2 and "ok: " in out and "invalid: bad.json" in err


def test_help_lists_the_exit_codes(pg: PG) -> None:
    for command in ("check", "gen-baselines", "run"):
        code, out, _ = pg(command, "--help")
        assert code == 0
        assert "0 same (no figure slower, none can't tell); 1 slower" in " ".join(out.split())


# ---- the real smoke pipelines --------------------------------------------------------------


@pytest.fixture
def smoke(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    pytest.importorskip("perfguard.workloads.pipeline")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PERFGUARD_CASES", str(REPO / "cases"))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.delenv("PERFGUARD_FACTORY", raising=False)
    return tmp_path


SLEEP_PIPES = """
import time

import torch

from perfguard.device.timer import stage, step


def pipeline(case, platform):
    def run():
        with stage("TextEncodingStage"):
            time.sleep(0.002)
        with stage("DenoisingStage"):
            for i in range(4):
                with step(i):
                    time.sleep(0.005)
        with stage("DecodingStage"):
            time.sleep(0.003)
        return torch.zeros(4)

    return run
"""


def test_smoke_case_gen_baselines_then_check_passes_and_an_injected_slowdown_fails(
    smoke: Path, pg: PG, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Done-when of the issue, through every moving part of the gate.

    gen-baselines pools three fresh processes; each check runs `--isolate`, so its
    confirmations are fresh processes too; the A/A check passes and +50 % injected into
    the denoising stage fails after the gate confirmed it in two more processes.

    The stages sleep instead of computing: on this 2-core runner the real smoke
    pipeline's denoising stage has been measured at 14-27 ms across three processes
    within a minute while other jobs ran, so a verdict on it is a verdict on the
    machine (`benchmarks/detection.py` measures how the gate copes with that). A sleep
    lasts what it says however busy the cores are, and the injected busy-wait is
    measured against the stage's own time, so this test checks the gate, not the
    machine. The real pipelines run through the same commands in
    `tests/test_calibrate.py`.
    """
    (smoke / "pg_sleep_pipes.py").write_text(SLEEP_PIPES)
    monkeypatch.setenv("PYTHONPATH", f"{smoke}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.syspath_prepend(str(smoke))
    base = ("--platform", "cpu", "--repeats", "5", "--warmup", "1")
    qwen = ("--case", "qwen_image_t2i_smoke", "--factory", "pg_sleep_pipes:pipeline")
    # Raw timings: a sleep is no CPU work, so dividing it by the reference beside each run
    # would add the reference's noise to a steady figure (docs/baselines.md).
    code, out, err = pg("gen-baselines", *base, *qwen, "--processes", "3", "--timing", "raw")
    assert code == 0, out + err
    assert "updated 1 of 1 case(s)" in out and "3 processes" in out
    saved = json.loads(Path(f"baselines/cpu/{Platform().hardware_slug()}.json").read_text())
    assert (
        len(saved["scenarios"]["qwen_image_t2i_smoke"]["stages"]["DenoisingStage"]["processes"])
        == 3
    )

    def measured(*args: str) -> tuple[int, str, str]:
        # Exit 4 is no verdict: the reference workload found the runner contended after
        # the gate's own waits (a neighbour on a shared CI host). The sleeps cannot be
        # contended, the yardstick can, so such a check is run again, at most twice.
        for _ in range(3):
            code, out, err = pg("check", *base, *qwen, "--isolate", *args)
            if code != 4:
                break
        return code, out, err

    code, out, err = measured("--report", "pass.json")
    # Unchanged code is never slower; with three baseline processes on a shared host the
    # check may not be able to say the same within 3 % either (can't tell, exit 4, or,
    # where the baseline's runner cannot resolve 3 %, below resolution, exit 0), and says
    # so with the figures (perfguard/decision/answer.py, resolution.py).
    passed = json.loads(Path("pass.json").read_text())
    assert code in (0, 4) and passed["answer"] in ("same", "cant_tell", "unresolved"), out + err
    assert (code == 4) == (passed["answer"] == "cant_tell" or passed["verdict"] == "contended")
    code, out, err = measured("--inject", "DenoisingStage=+50%", "--report", "slow.json")
    report = json.loads(Path("slow.json").read_text())
    case = report["cases"]["qwen_image_t2i_smoke"]
    assert "stage:DenoisingStage" in out and "confirming in a fresh process (1 of" in err
    assert report["settings"]["inject"] == "DenoisingStage=+50%"
    # confirmed in fresh processes before it is reported (two, unless one of them ran on
    # a contended runner and was left out)
    sampling = case["sampling"]
    assert sampling["groups"] == 1 + sampling["confirmations"]
    stage = case["metrics"]["stage:DenoisingStage"]
    if sampling["confirmations"] == 0:
        # Every confirmation ran on a busy runner: one process is no verdict (exit 4),
        # and the report says why.
        assert "ran on a contended runner; left out" in sampling.get("note", ""), sampling
        assert code == 4 and stage["verdict"] == "contended", out + err + json.dumps(case)
        assert "not confirmed" in stage["reason"]
        return
    assert code == 1, out + err + json.dumps(case)
    assert stage["verdict"] == "regression" and stage["ratio_low"] > 1
    assert stage["answer"]["answer"] == "slower" and report["answer"] == "slower"


def test_a_reader_that_closes_the_pipe_early_keeps_the_verdicts_exit_code(
    fake: Path, pg: PG
) -> None:
    # `perfguard check ... | head -0`: the table meets a closed pipe, the verdict (1) stands.
    import os
    import subprocess
    import sys

    pg(*GEN)
    BEHAVIOUR.slow["DecodingStage"] = 3.0
    pg("run", "--repeats", "3", "--warmup", "0", "--out", "res.json")
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.Popen(
        [sys.executable, "-m", "perfguard", "judge", "--results", "res.json"],
        stdout=write,
        stderr=subprocess.PIPE,
        env={**os.environ, "PERFGUARD_PLATFORM": "cpu"},
    )
    os.close(write)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err.decode()
    assert err.decode() == ""
