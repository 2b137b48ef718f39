"""The gate's precision: thread policy, measured bands with noise-scaled pads, Student's t,
comparability of baselines (threads, reference workload), credible-only tightening.

Statistics run on seeded synthetic samples and the CLI on the virtual-clock fake
pipelines of tests/test_cli_check.py: nothing here depends on how busy the machine is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from perfguard.decision.records import PASS, REGRESSION
from perfguard.decision.stats import summarize, t_quantile, z_quantile
from perfguard.decision.tolerances import MIN_EFFECT, Band, default_profiles, sglang_profiles
from perfguard.decision.verdict import judge_metric
from perfguard.device import threads
from perfguard.device.platform import Platform
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.runner import run_case
from perfguard.storage.cases import Case
from tests.fake_pipeline import CHECK, GEN
from tests.helpers import PG, noisy

M = "stage:DenoisingStage"


# ---- thread policy --------------------------------------------------------------------------


def test_cpu_cases_run_with_one_intra_op_thread_and_record_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(threads.ENV_OVERRIDE, raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        res = run_case(
            Case(id="c", workload="qwen_image", preset="tiny"),
            Platform(),
            MeasureOptions(repeats=1, warmup=0),
            factory=lambda case, platform: lambda: torch.zeros(1),
        )
        assert res.status == "ok" and res.threads == {"intra_op": 1, "inter_op": 1}
        case = Case(id="c", workload="qwen_image", preset="tiny", threads=2)
        assert threads.case_threads(case, "cpu") == 2
        assert threads.case_threads(Case(id="c", workload="qwen_image", preset="tiny"), "cuda") == 4
        monkeypatch.setenv(threads.ENV_OVERRIDE, "3")
        assert threads.case_threads(case, "cpu") == 3  # --threads wins over the case
        monkeypatch.setenv(threads.ENV_OVERRIDE, "zero")
        with pytest.raises(Exception, match="PERFGUARD_THREADS"):
            threads.case_threads(case, "cpu")
    finally:
        torch.set_num_threads(before)


def test_a_case_with_fewer_than_one_thread_is_a_schema_error(tmp_path: Path, pg: PG) -> None:
    (tmp_path / "common.toml").write_text(
        '[[case]]\nid = "t"\nworkload = "qwen_image"\npreset = "tiny"\nthreads = 0\n'
    )
    code, _, err = pg("list-cases", "--platform", "cpu", "--cases", str(tmp_path))
    assert code == 2 and "case 't': threads:" in err and "common.toml" in err


def test_env_json_records_the_thread_policy_and_the_reference_workload(pg: PG) -> None:
    code, out, _ = pg("env", "--json", "--platform", "cpu")
    fp = json.loads(out)
    assert code == 0 and fp["threads"]["default_intra_op"] == 1
    assert len(fp["reference_workload"]) == 12


def test_a_baseline_of_another_thread_count_is_refused_naming_both(
    fake: Path,
    pg: PG,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `--threads` travels as $PERFGUARD_THREADS: registered here, so teardown removes it.
    monkeypatch.delenv(threads.ENV_OVERRIDE, raising=False)
    monkeypatch.setenv(threads.ENV_OVERRIDE, "1")
    assert pg(*GEN)[0] == 0
    data = json.loads(fake.read_text())
    for s in data["scenarios"].values():
        assert s["threads"] == {"inter_op": 1, "intra_op": 1}
        s["threads"]["intra_op"] = 2
    fake.write_text(json.dumps(data))
    code, _, err = pg(*CHECK)
    assert code == 2 and err.count("\n") == 1
    assert "2 intra-op thread(s)" in err and "would use 1" in err
    code, _, err = pg(*CHECK, "--threads", "2")
    assert code != 2 and code in (0, 1) and "thread" not in err  # matching counts: compared


def test_a_baseline_of_another_reference_workload_is_refused(fake: Path, pg: PG) -> None:
    assert pg(*GEN)[0] == 0
    data = json.loads(fake.read_text())
    for s in data["scenarios"].values():
        s["reference_version"] = "000000000000"
    fake.write_text(json.dumps(data))
    code, _, err = pg(*CHECK)
    assert code == 2 and "reference workload is version 000000000000" in err


# ---- bands ---------------------------------------------------------------------------------


MEASURED = default_profiles("cpu")["pr_test"]


def test_measured_bands_are_the_minimum_effect_and_sglangs_stay_for_imports() -> None:
    assert MEASURED.band(M).rel == MIN_EFFECT["denoise_stage"] == 0.03
    assert MEASURED.band("e2e").rel == MEASURED.band("step_median").rel == 0.03
    assert MEASURED.floors == {} and MEASURED.noise_pad == 3.0
    assert sglang_profiles("cuda")["pr_test"].band(M) == Band(0.25, 120.0)


def test_the_pad_scales_with_the_baseline_noise() -> None:
    tiny = summarize(noisy(0.1, 0.3, 20, seed=1))  # a 0.1 ms stage, 30 % jitter
    big = summarize(noisy(7.0, 0.015, 20, seed=2))
    tiny_band = MEASURED.noise_band(MEASURED.band("stage:InputValidationStage"), tiny)
    big_band = MEASURED.noise_band(MEASURED.band(M), big)
    assert tiny_band.abs > 0.01  # above the floor: the jitter sets it
    assert tiny_band.abs < 0.1  # and it stays smaller than the stage
    assert big_band.bound(7.0) == pytest.approx(7.0 * 1.03, rel=1e-3)  # rel decides
    # A stage that jittery does not fail on a run as jittery, a little slower.
    v = judge_metric("stage:InputValidationStage", noisy(0.105, 0.3, 20, seed=3), tiny, tiny_band)
    assert v.verdict == PASS


def test_a_small_stage_seven_times_slower_fails() -> None:
    base = summarize(noisy(0.18, 0.03, 20, seed=4))
    band = MEASURED.noise_band(MEASURED.band("stage:TextEncodingStage"), base)
    v = judge_metric("stage:TextEncodingStage", noisy(1.3, 0.03, 20, seed=5), base, band)
    assert v.verdict == REGRESSION
    # sglang's CPU-scaled pad (1.2 ms) let it grow by 1.2 ms unseen.
    old = sglang_profiles("cpu")["pr_test"].band("stage:TextEncodingStage")
    assert (
        judge_metric("stage:TextEncodingStage", noisy(1.3, 0.03, 20, seed=5), base, old).verdict
        == PASS
    )


def test_a_credible_ten_percent_slowdown_fails_and_unchanged_code_passes() -> None:
    groups = [10, 10, 10]
    base = summarize(
        noisy(7.0, 0.015, 10, 6) + noisy(7.1, 0.015, 10, 7) + noisy(6.95, 0.015, 10, 8),
        groups=groups,
    )
    band = MEASURED.noise_band(MEASURED.band(M), base)
    slow = noisy(7.7, 0.015, 10, 9) + noisy(7.75, 0.015, 10, 10) + noisy(7.68, 0.015, 10, 11)
    same = noisy(7.02, 0.015, 10, 12) + noisy(7.08, 0.015, 10, 13) + noisy(6.97, 0.015, 10, 14)
    assert judge_metric(M, slow, base, band, groups=groups).verdict == REGRESSION
    assert judge_metric(M, same, base, band, groups=groups).verdict == PASS


def test_the_interval_uses_students_t_with_the_process_dof() -> None:
    assert t_quantile(0.01, 2) == pytest.approx(6.965, abs=1e-3)
    assert t_quantile(0.01, 4) == pytest.approx(3.747, abs=1e-3)
    assert t_quantile(0.01, 0) == z_quantile(0.01)
    base = summarize(noisy(10.0, 0.01, 10, 1) + noisy(10.3, 0.01, 10, 2), groups=[10, 10])
    cur = noisy(11.0, 0.01, 10, 3)
    v = judge_metric(M, cur, base, Band(0.03, 0.0), groups=None)
    assert v.noise is not None and v.noise.dof == 1
    # With one degree of freedom the 99 % quantile is 31.8: +10 % is not credible.
    assert v.verdict == PASS and v.low is not None and v.low < 1


def test_noise_keeps_both_degrees_of_freedom_through_json() -> None:
    from perfguard.decision.stats import Noise

    noise = Noise(0.02, 0.01, 0.02, 3, 4, between_dof=5, within_dof=40)
    again = Noise.from_json(noise.to_json())
    assert again == noise
    assert again.dof == 5 and again.source == "between-process spread (5 dof)"
    old = {k: v for k, v in noise.to_json().items() if not k.endswith("_dof")}
    assert Noise.from_json(old).within_dof == Noise.from_json(old).between_dof == 5
