"""perfguard gated by perfguard: the committed CPU work baseline of the smoke cases.

`baselines/cpu/smoke-work.json` holds what the two reference pipelines do (ops, FLOPs,
bytes allocated and host syncs per stage and step, the output), counted with the
libraries of `.ci/work-constraints.txt`; ci.yml's `work` job checks it on every push and
pull request. These tests run that job's own command line (read from ci.yml, so there is
one invocation): it passes on this code, and it fails when a smoke case turns one of the
three reference optimizations off, naming the stage whose work grew.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from tests.helpers import PG

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "baselines" / "cpu" / "smoke-work.json"
CONSTRAINTS = ROOT / ".ci" / "work-constraints.txt"
SMOKE = {"qwen_image_t2i_smoke", "glm_image_t2i_smoke"}


def ci_work_command() -> list[str]:
    """The `perfguard` command of ci.yml's `work` job, as its step runs it."""
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())
    scripts = [s["run"] for s in workflow["jobs"]["work"]["steps"] if "run" in s]
    (line,) = [line for s in scripts for line in s.splitlines() if line.startswith("perfguard ")]
    return shlex.split(line)


def version_drift() -> list[str]:
    """The libraries whose installed version is not the one the baseline was counted with."""
    drift = []
    for line in CONSTRAINTS.read_text().splitlines():
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s#]+)", line.strip())
        if m:
            have = importlib.metadata.version(m.group(1)).split("+")[0]
            if have != m.group(2):
                drift.append(f"{m.group(1)} {have} (baseline: {m.group(2)})")
    import torch

    counted = {
        s["work"]["context"]["torch"]
        for s in json.loads(BASELINE.read_text())["scenarios"].values()
    }
    if counted != {torch.__version__}:
        drift.append(f"torch build {torch.__version__} (baseline: {', '.join(sorted(counted))})")
    return drift


@pytest.fixture()
def work_check(pg: PG, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """ci.yml's work check, run here with its Markdown in tmp_path; skipped (naming the
    versions) where the libraries are not the baseline's: the counts would differ for a
    reason no commit made, and ci.yml's work job installs the right ones."""
    drift = version_drift()
    if drift:
        pytest.skip("the work baseline was counted with other libraries: " + "; ".join(drift))
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    cmd = ci_work_command()
    md = cmd.index("--markdown") + 1
    cmd[md] = str(tmp_path / "work.md")

    def run(*more: str) -> tuple[int, str, str, dict]:
        report = tmp_path / "work.json"
        code, out, err = pg(*cmd[1:], "--report", str(report), *more)
        return code, out, err, json.loads(report.read_text()) if report.exists() else {}

    return run


def test_ci_checks_the_committed_baseline_by_path_work_only() -> None:
    cmd = ci_work_command()
    assert cmd[cmd.index("--baseline") + 1] == "baselines/cpu/smoke-work.json"
    assert cmd[cmd.index("--tag") + 1] == "smoke"
    assert cmd[cmd.index("--platform") + 1] == "cpu"
    data = json.loads(BASELINE.read_text())
    assert set(data["scenarios"]) == SMOKE
    for scenario in data["scenarios"].values():
        # Nothing timed is stored, so nothing timed can be judged, on any runner's CPU.
        assert "e2e" not in scenario and not scenario["stages"] and not scenario["steps"]
        assert not [m for m in scenario if m.startswith("step_")], sorted(scenario)
        assert scenario["work"]["runs"] == 1 and scenario["output_hash"]


def test_the_committed_work_baseline_passes_on_this_code(work_check) -> None:  # type: ignore[no-untyped-def]
    code, out, err, report = work_check()
    assert code == 0, out + err
    assert set(report["cases"]) == SMOKE
    for case in report["cases"].values():
        assert case["output"]["verdict"] != "changed"
        assert "note" not in case.get("work", {}), case["work"]  # the counts were compared
        assert any(m.startswith("ops:") for m in case["metrics"])


SMOKE_CASES = ROOT / "cases" / "common.toml"
OFF = {
    "qwen_modulation_cache": "qwen_image_t2i_smoke",
    "qwen_varlen_host_meta": "qwen_image_t2i_smoke",
    "glm_prior_drop_inplace": "glm_image_t2i_smoke",
}


@pytest.mark.parametrize("toggle", sorted(OFF))
def test_turning_a_reference_optimization_off_fails_the_work_check(
    toggle: str,
    work_check,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    case_id = OFF[toggle]
    cases = tmp_path / "cases"
    cases.mkdir()
    for f in (ROOT / "cases").glob("*.toml"):
        (cases / f.name).write_text(f.read_text())
    text = SMOKE_CASES.read_text()
    marker = f'id = "{case_id}"\n'
    assert text.count(marker) == 1
    (cases / "common.toml").write_text(
        text.replace(marker, f"{marker}toggles = {{ {toggle} = false }}\n")
    )
    code, out, err, report = work_check("--cases", str(cases), "--case", case_id)
    assert code == 1, out + err
    failed = [
        m for m, v in report["cases"][case_id]["metrics"].items() if v["verdict"] == "regression"
    ]
    assert any(m.endswith(":DenoisingStage") for m in failed), failed
    assert f"{case_id}: DenoisingStage: " in out
