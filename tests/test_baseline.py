"""The baseline store: layout, validation, atomic locked updates, tighten, prune, diff."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from perfguard.decision import changes
from perfguard.decision.stats import Summary
from perfguard.errors import PerfguardError
from perfguard.results import CaseResult
from perfguard.storage import baseline as store
from perfguard.storage import refresh
from tests.helpers import measured

ENV = {"platform": "cpu", "hardware": "test-cpu", "git_commit": "a" * 40, "hostname": "h"}


def ok(case_id: str, scale: float = 1.0, **case: Any) -> CaseResult:
    samples = {
        "e2e": [10.0 * scale, 10.4 * scale, 10.2 * scale],
        "stage:DenoisingStage": [8.0 * scale, 8.1 * scale, 8.2 * scale],
        "step:0": [2.0 * scale] * 3,
        "step:1": [1.0 * scale] * 3,
        "step_avg": [1.5 * scale] * 3,
        "step_median": [1.5 * scale] * 3,
        "peak_memory": [300.0, 300.0, 300.1234567],
    }
    return measured(case_id, samples, load_ms=12.3456789, case={"tags": ["smoke"], **case})


def write(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data), encoding="utf-8")


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "baselines" / "cpu" / "test-cpu.json"


def test_default_path_is_platform_then_hardware_slug() -> None:
    assert store.default_path("cuda", "nvidia-h100") == Path("baselines/cuda/nvidia-h100.json")


def test_first_case_creates_a_valid_file_with_the_platforms_profiles(path: Path) -> None:
    refresh.record_case(path, ok("a"), ENV)
    b = store.load(path)
    assert (b.platform, b.hardware) == ("cpu", "test-cpu")
    assert set(b.profiles) == {"pr_test", "long_term"}
    # perfguard's own measurements get the measured profile: the minimum effect of
    # interest, a timer-jitter floor, and pads that scale with the baseline's noise
    pr = b.profiles["pr_test"]
    assert (pr.rel["denoise_stage"], pr.abs["denoise_stage"], pr.noise_pad) == (0.03, 0.01, 3.0)
    e2e = b.scenarios["a"].metrics["e2e"]
    assert (e2e.median, e2e.n, e2e.min, e2e.max) == (10.2, 3, 10.0, 10.4)
    assert e2e.samples == (10.0, 10.4, 10.2)
    assert b.metadata["git_commit"] == "a" * 40


def test_file_is_deterministic_sorted_rounded_with_a_trailing_newline(path: Path) -> None:
    refresh.record_case(path, ok("a"), ENV)
    text = path.read_text()
    data = json.loads(text)
    assert text.endswith("}\n")
    assert text == json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    scen = data["scenarios"]["a"]
    assert scen["peak_memory"]["samples"][2] == 300.123
    assert scen["load_ms"] == 12.346
    assert [st["median"] for st in scen["steps"]] == [2.0, 1.0]  # a list, in step order
    assert scen["stages"]["DenoisingStage"]["median"] == 8.1


def test_regenerating_one_case_keeps_the_others_and_the_human_fields(path: Path) -> None:
    refresh.record_case(path, ok("a"), ENV)
    refresh.record_case(path, ok("b"), ENV)
    data = json.loads(path.read_text())
    data["scenarios"]["a"]["notes"] = "measured on a quiet runner"
    data["scenarios"]["a"]["tolerance_overrides"] = {"e2e": {"rel": 0.5}}
    write(path, data)
    created = data["metadata"]["created"]
    refresh.record_case(path, ok("a", scale=2.0), ENV)
    b = store.load(path)
    assert b.scenarios["a"].notes == "measured on a quiet runner"
    assert b.scenarios["a"].tolerance_overrides == {"e2e": {"rel": 0.5}}
    assert b.scenarios["a"].metrics["e2e"].median == 20.4
    assert b.scenarios["b"].metrics["e2e"].median == 10.2
    assert b.metadata["created"] == created


def test_tighten_only_ever_lowers_figures(path: Path) -> None:
    refresh.record_case(path, ok("a"), ENV)
    slower = ok("a", scale=2.0)
    slower.samples["e2e"] = [8.0, 8.4, 8.2]  # credibly faster: taken, at its median
    del slower.samples["step_avg"]  # and this one was not measured
    refresh.record_case(path, slower, ENV, tighten=True)
    m = store.load(path).scenarios["a"].metrics
    assert m["e2e"].median == 8.2
    assert m["stage:DenoisingStage"].median == 8.1  # slower: kept
    assert m["step_avg"].median == 1.5


def test_tighten_ignores_a_lower_median_that_noise_explains(path: Path) -> None:
    # Keeping the lower of two medians walks a baseline into the lucky tail of the noise
    # one refresh at a time; only a credible improvement moves it.
    refresh.record_case(path, ok("a"), ENV)
    for lucky in ([10.1, 10.5, 9.7], [10.0, 10.3, 9.9], [9.9, 10.6, 10.1]):
        again = ok("a")
        again.samples["e2e"] = lucky
        refresh.record_case(path, again, ENV, tighten=True)
    assert store.load(path).scenarios["a"].metrics["e2e"].median == 10.2


def test_prune_drops_scenarios_whose_case_is_gone(path: Path) -> None:
    for cid in ("a", "b", "c"):
        refresh.record_case(path, ok(cid), ENV)
    assert store.prune(path, {"a", "c", "z"}) == ["b"]
    assert set(store.load(path).scenarios) == {"a", "c"}


def test_concurrent_writers_of_different_cases_lose_nothing(path: Path) -> None:
    ids = [f"case{i}" for i in range(6)]
    threads = [threading.Thread(target=refresh.record_case, args=(path, ok(i), ENV)) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(store.load(path).scenarios) == set(ids)


def test_a_baseline_for_another_platform_is_refused_and_left_alone(path: Path) -> None:
    refresh.record_case(path, ok("a"), {**ENV, "platform": "cuda", "hardware": "h100"})
    before = path.read_bytes()
    with pytest.raises(PerfguardError, match="for platform 'cuda', not 'cpu'"):
        refresh.record_case(path, ok("b"), ENV)
    assert path.read_bytes() == before


def test_an_invalid_baseline_is_never_written(path: Path) -> None:
    refresh.record_case(path, ok("a"), ENV)
    before = path.read_bytes()
    b = store.load(path)
    bad = store.Scenario(metrics={"e2e": Summary(median=-1.0, n=1)})
    with pytest.raises(PerfguardError, match=r"about to be written.*\$\.scenarios\.x\.e2e\.median"):
        store.save(path, b.with_scenario("x", bad))
    assert path.read_bytes() == before


# ---- bad files -----------------------------------------------------------------------------


def _valid(path: Path) -> dict[str, Any]:
    refresh.record_case(path, ok("a"), ENV)
    return json.loads(path.read_text())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty file"),
        ('{"kind": "perfguard.baseline", "scen', "malformed JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"e2e": NaN}', "NaN is not a valid number"),
    ],
)
def test_unreadable_files_are_one_line_errors_naming_the_file(
    path: Path, text: str, message: str
) -> None:
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(PerfguardError, match=message) as exc:
        store.load(path)
    assert str(path) in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (lambda d: d["scenarios"]["a"]["e2e"].update(median=-3.0), "$.scenarios.a.e2e.median"),
        (lambda d: d["scenarios"]["a"]["e2e"].update(median="9"), "$.scenarios.a.e2e.median"),
        (lambda d: d["scenarios"]["a"]["e2e"].update(median=1e400), "$.scenarios.a.e2e.median"),
        (
            lambda d: d["scenarios"]["a"].update(tolerance_overrides={"e2e": {"rell": 1}}),
            "$.scenarios.a.tolerance_overrides.e2e",
        ),
        (
            lambda d: d["scenarios"]["a"].update(tolerance_overrides={"latency": {"rel": 1}}),
            "$.scenarios.a.tolerance_overrides",
        ),
        (lambda d: d["tolerances"]["pr_test"]["rel"].update(load=0.4), "$.tolerances.pr_test.rel"),
        (lambda d: d["tolerances"].pop("long_term"), "$.tolerances"),
        (lambda d: d["scenarios"]["a"]["e2e"].update(n=4), "$.scenarios.a.e2e"),
        (lambda d: d["scenarios"]["a"].update(colour="red"), "$.scenarios.a"),
        (lambda d: d.update(schema_version=2), "$.schema_version"),
    ],
)
def test_schema_violations_name_the_file_and_the_json_path(
    path: Path, edit: Any, where: str
) -> None:
    data = _valid(path)
    edit(data)
    text = json.dumps(data).replace("Infinity", "1e400")
    path.write_text(text)
    with pytest.raises(PerfguardError) as exc:
        store.load(path)
    assert str(exc.value).startswith(f"{path}: {where}")


def test_an_sglang_file_is_recognized_and_the_import_command_suggested(tmp_path: Path) -> None:
    src = tmp_path / "perf_baselines.json"
    write(src, {"scenarios": {"x": {"expected_e2e_ms": 1.0}}})
    with pytest.raises(PerfguardError, match="import-sglang"):
        store.load(src)


# ---- diff ----------------------------------------------------------------------------------


def test_diff_lists_added_removed_changed_and_tolerance_changes(tmp_path: Path) -> None:
    a_path, b_path = tmp_path / "a.json", tmp_path / "b.json"
    refresh.record_case(a_path, ok("keep"), ENV)
    refresh.record_case(a_path, ok("gone"), ENV)
    refresh.record_case(b_path, ok("keep", scale=1.1), ENV)
    refresh.record_case(b_path, ok("new"), ENV)
    data = json.loads(b_path.read_text())
    data["tolerances"]["pr_test"]["rel"]["e2e"] = 0.1
    write(b_path, data)
    d = changes.diff(store.load(a_path), store.load(b_path))
    assert (d.added, d.removed, d.tolerance_changes) == (("new",), ("gone",), ("pr_test",))
    e2e = next(r for r in d.changed if r.metric == "e2e")
    assert (e2e.case_id, e2e.old, e2e.new) == ("keep", 10.2, 11.22)
    assert not any(r.metric == "peak_memory" for r in d.changed)
    assert changes.diff(store.load(a_path), store.load(a_path)).empty
