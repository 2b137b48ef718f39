"""Case registries: loading per platform, dedupe, selection, and every bad-input error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from perfguard.errors import PerfguardError
from perfguard.storage.cases import TOGGLES, load_registry, select

REPO = Path(__file__).resolve().parent.parent

QWEN = """
[[case]]
id = "{id}"
workload = "qwen_image"
preset = "tiny"
steps = {steps}
batch = 2
prompt_lengths = [8, 5]
tags = ["smoke"]
"""


def _registry(tmp_path: Path, **files: str) -> Path:
    for name, text in files.items():
        (tmp_path / f"{name}.toml").write_text(text)
    return tmp_path


@pytest.mark.parametrize("platform", ["cpu", "cuda", "rocm", "npu"])
def test_shipped_registries_load_for_every_platform(platform: str) -> None:
    cases = load_registry(platform, REPO / "cases")
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids))
    assert {"qwen_image_t2i_smoke", "glm_image_t2i_smoke"} <= set(ids)
    assert {c.workload for c in cases} == {"qwen_image", "glm_image"}


def test_shipped_smoke_cases_exercise_the_masked_path_on_cpu() -> None:
    smoke = select(load_registry("cpu", REPO / "cases"), tags=["smoke"])
    assert {c.preset for c in smoke} == {"tiny"}
    qwen = next(c for c in smoke if c.workload == "qwen_image")
    assert len(set(qwen.prompt_lengths)) > 1  # one padded row
    assert all(qwen.toggle(t) for t in TOGGLES)  # optimizations default on


def test_device_registries_use_published_sizes_and_sglang_ids() -> None:
    npu = {c.id: c for c in load_registry("npu", REPO / "cases")}
    assert {"qwen_image_t2i_1npu", "qwen_image_t2i_2npu", "glm_image_t2i_1npu"} <= set(npu)
    assert npu["qwen_image_t2i_2npu"].num_devices == 2
    cuda = {c.id: c for c in load_registry("cuda", REPO / "cases")}
    t2i = cuda["qwen_image_t2i"]
    assert (t2i.preset, t2i.height, t2i.width, t2i.steps, t2i.dtype) == (
        "full",
        1024,
        1024,
        50,
        "bfloat16",
    )


def test_platform_file_adds_to_common(tmp_path: Path) -> None:
    reg = _registry(
        tmp_path,
        common=QWEN.format(id="shared", steps=2),
        cpu=QWEN.format(id="cpu_only", steps=2),
        cuda=QWEN.format(id="cuda_only", steps=2),
    )
    assert [c.id for c in load_registry("cpu", reg)] == ["shared", "cpu_only"]
    assert [c.id for c in load_registry("cuda", reg)] == ["shared", "cuda_only"]
    assert load_registry("cpu", reg)[1].source.endswith("cpu.toml")


def test_identical_duplicates_collapse(tmp_path: Path) -> None:
    reg = _registry(tmp_path, common=QWEN.format(id="a", steps=2), cpu=QWEN.format(id="a", steps=2))
    assert [c.id for c in load_registry("cpu", reg)] == ["a"]


def test_conflicting_duplicates_name_both_files(tmp_path: Path) -> None:
    reg = _registry(tmp_path, common=QWEN.format(id="a", steps=2), cpu=QWEN.format(id="a", steps=3))
    with pytest.raises(
        PerfguardError, match=r"'a' is defined differently in .*common\.toml and .*cpu\.toml"
    ):
        load_registry("cpu", reg)


def test_malformed_toml_names_the_file(tmp_path: Path) -> None:
    reg = _registry(tmp_path, common="[[case]\nid = ")
    with pytest.raises(PerfguardError, match=r"common\.toml: malformed TOML"):
        load_registry("cpu", reg)


@pytest.mark.parametrize(
    ("patch", "field", "reason"),
    [
        ("steps = 0", "steps", "less than the minimum"),
        ('workload = "flux"', "workload", "is not one of"),
        ('preset = "huge"', "preset", "is not one of"),
        ('id = "../etc"', "id", "does not match"),
        ('colour = "red"', "(case)", "Additional properties"),
        ("toggles = { turbo = true }", "toggles", "Additional properties"),
        ("tolerance_overrides = { e2e = { rel = -1 } }", "tolerance_overrides.e2e.rel", "minimum"),
        ("tolerance_overrides = { speed = { rel = 1 } }", "tolerance_overrides", "does not match"),
    ],
)
def test_schema_violations_name_file_case_and_field(
    tmp_path: Path, patch: str, field: str, reason: str
) -> None:
    key = patch.split("=")[0].strip()
    lines = [
        ln
        for ln in QWEN.format(id="bad_case", steps=2).splitlines()
        if not ln.startswith(key + " ")
    ]
    reg = _registry(tmp_path, cpu="\n".join([*lines, patch]) + "\n")
    with pytest.raises(PerfguardError) as info:
        load_registry("cpu", reg)
    msg = str(info.value)
    assert "cpu.toml" in msg and f": {field}:" in msg and reason in msg
    assert "\n" not in msg


def test_prompt_lengths_must_match_batch(tmp_path: Path) -> None:
    reg = _registry(tmp_path, cpu=QWEN.format(id="x", steps=2).replace("batch = 2", "batch = 3"))
    with pytest.raises(PerfguardError, match="prompt_lengths: has 2 entries but batch is 3"):
        load_registry("cpu", reg)


def test_missing_registry_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PerfguardError, match="does not exist"):
        load_registry("cpu", tmp_path / "nope")
    with pytest.raises(PerfguardError, match="no case registry for platform 'cpu'"):
        load_registry("cpu", tmp_path)


def test_selection_by_id_regex_and_tag(tmp_path: Path) -> None:
    text = "".join(QWEN.format(id=i, steps=2) for i in ("qwen_a", "qwen_b", "glm_c"))
    text = text.replace('tags = ["smoke"]', 'tags = ["nightly"]', 1)  # qwen_a only
    cases = load_registry("cpu", _registry(tmp_path, common=text))
    assert [c.id for c in select(cases, ids=["qwen_b"])] == ["qwen_b"]
    assert [c.id for c in select(cases, match="^qwen")] == ["qwen_a", "qwen_b"]
    assert [c.id for c in select(cases, tags=["smoke"])] == ["qwen_b", "glm_c"]
    assert [c.id for c in select(cases, match="^qwen", tags=["smoke"])] == ["qwen_b"]
    assert [c.id for c in select(cases, tags=["nightly", "smoke"])] == ["qwen_a", "qwen_b", "glm_c"]
    assert select(cases, tags=["weekly"]) == []
    assert len(select(cases)) == 3


def test_with_toggles_changes_only_the_toggles() -> None:
    case = next(c for c in load_registry("cpu", REPO / "cases") if c.workload == "qwen_image")
    off = case.with_toggles(qwen_modulation_cache=False)
    assert off.toggles == {**case.toggles, "qwen_modulation_cache": False}
    assert not off.toggle("qwen_modulation_cache")
    # Still a value of the same shape: tuples stay tuples, so an unchanged copy is equal.
    assert off.prompt_lengths == case.prompt_lengths and off.tags == case.tags
    assert off.source == case.source
    assert case.with_toggles() == case
    with pytest.raises(PerfguardError, match="unknown toggle 'turbo'"):
        case.with_toggles(turbo=True)


def test_toggle_names_agree_with_the_models_and_the_schema() -> None:
    from perfguard.storage.jsonio import schema
    from perfguard.workloads.presets import TOGGLES as MODEL_TOGGLES

    assert set(TOGGLES) == set(MODEL_TOGGLES)
    assert set(TOGGLES) == set(schema("case")["properties"]["toggles"]["properties"])


def test_unknown_case_id_and_invalid_regex_are_errors(tmp_path: Path) -> None:
    cases = load_registry("cpu", _registry(tmp_path, common=QWEN.format(id="a", steps=1)))
    with pytest.raises(PerfguardError, match="unknown case id"):
        select(cases, ids=["zzz"])
    with pytest.raises(PerfguardError, match="invalid regular expression"):
        select(cases, match="(")


def _cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perfguard", *args], capture_output=True, text=True, cwd=cwd
    )


def test_list_cases_json_lists_id_workload_preset_tags_and_file() -> None:
    out = _cli("list-cases", "--platform", "cpu", "--tag", "smoke", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert {r["id"] for r in rows} == {"qwen_image_t2i_smoke", "glm_image_t2i_smoke"}
    for row in rows:
        assert {"id", "workload", "preset", "tags", "source"} <= set(row)


@pytest.mark.parametrize(
    "args",
    [
        ["list-cases", "--case", "nope"],
        ["list-cases", "--match", "("],
        ["list-cases", "--platform", "npu"],
        ["list-cases", "--cases", "/nonexistent"],
    ],
)
def test_cli_errors_are_one_line_exit_2_without_traceback(args: list[str]) -> None:
    out = _cli(*args)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_cli_schema_error_names_the_case(tmp_path: Path) -> None:
    (tmp_path / "common.toml").write_text(QWEN.format(id="broken", steps=-1))
    out = _cli("list-cases", "--platform", "cpu", "--cases", str(tmp_path))
    assert out.returncode == 2
    assert "case 'broken': steps:" in out.stderr


def test_env_json_prints_the_fingerprint() -> None:
    out = _cli("env", "--json", "--platform", "cpu")
    assert out.returncode == 0, out.stderr
    fp = json.loads(out.stdout)
    assert fp["platform"] == "cpu" and fp["availability"]["cpu"]["available"]


def test_outside_a_checkout_the_default_registry_is_the_projects_cases_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from perfguard.storage.cases import default_cases_dir

    monkeypatch.chdir(tmp_path)  # no ./cases here
    monkeypatch.delenv("PERFGUARD_CASES", raising=False)
    root = Path(__file__).resolve().parents[1]
    assert default_cases_dir() == root / "cases"
    assert (root / "cases" / "common.toml").is_file()


def test_prior_tokens_is_glm_only_and_covers_the_target_grid(tmp_path: Path) -> None:
    glm = (
        '[[case]]\nid = "g"\nworkload = "glm_image"\npreset = "tiny"\nheight = 64\n'
        "width = 64\noptions = {{ prior_tokens = {n} }}\n"
    )
    assert load_registry("cpu", _registry(tmp_path, common=glm.format(n=4)))[0].options == {
        "prior_tokens": 4
    }
    with pytest.raises(PerfguardError, match=r"options.prior_tokens: 3 is fewer than the 4"):
        load_registry("cpu", _registry(tmp_path, common=glm.format(n=3)))
    qwen = glm.format(n=8).replace("glm_image", "qwen_image")
    with pytest.raises(PerfguardError, match=r"options.prior_tokens: only GLM-Image"):
        load_registry("cpu", _registry(tmp_path, common=qwen))
