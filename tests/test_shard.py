"""Sharding: `k/n` parsing, every case in exactly one shard, deterministic, balanced by time."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfguard.errors import EXIT_USAGE, PerfguardError
from perfguard.measurement.shard import (
    DEFAULT_TIME_S,
    Shard,
    expected_time_s,
    measured_from_e2e,
    select_shard,
    split,
)
from perfguard.storage.cases import Case


def case(cid: str, estimate: float | None = None) -> Case:
    return Case(id=cid, workload="qwen_image", preset="tiny", estimated_time_s=estimate)


@pytest.mark.parametrize("text", ["1/1", "1/4", "4/4", " 2 / 3 "])
def test_parse_accepts_k_of_n(text: str) -> None:
    shard = Shard.parse(text)
    assert str(shard) == text.replace(" ", "")


@pytest.mark.parametrize("text", ["0/4", "5/4", "1/0", "1", "a/b", "-1/2", "1/2/3", ""])
def test_parse_refuses_anything_else_as_a_usage_error(text: str) -> None:
    with pytest.raises(PerfguardError) as info:
        Shard.parse(text)
    assert info.value.exit_code == EXIT_USAGE
    assert "--shard" in str(info.value)


def test_longest_cases_are_spread_first() -> None:
    cases = [case("a", 4.0), case("b", 4.0), case("c", 0.3), case("d", 0.3)]
    shards = split(cases, 2)
    assert [[c.id for c in s] for s in shards] == [["a", "c"], ["b", "d"]]


def test_a_shard_keeps_the_selection_order() -> None:
    cases = [case("z", 1.0), case("a", 5.0), case("m", 1.0)]
    (only,) = split(cases, 1)
    assert [c.id for c in only] == ["z", "a", "m"]


def test_more_shards_than_cases_leaves_empty_shards() -> None:
    cases = [case("a"), case("b")]
    assert [len(s) for s in split(cases, 4)] == [1, 1, 0, 0]
    assert select_shard(cases, Shard(4, 4)) == []


def test_no_shard_selects_everything() -> None:
    cases = [case("a"), case("b")]
    assert select_shard(cases, None) == cases


def test_a_case_selected_twice_cannot_be_sharded() -> None:
    with pytest.raises(PerfguardError, match="selected twice"):
        split([case("a"), case("a")], 2)


def test_expected_time_prefers_the_estimate_then_the_baseline_then_one_second() -> None:
    measured = {"a": 9.0, "b": 2.5}
    assert expected_time_s(case("a", 4.0), measured) == 4.0
    assert expected_time_s(case("b"), measured) == 2.5
    assert expected_time_s(case("c"), measured) == DEFAULT_TIME_S
    assert expected_time_s(case("c")) == DEFAULT_TIME_S


def test_baseline_times_balance_cases_without_estimates() -> None:
    cases = [case("a"), case("b"), case("c"), case("d")]
    measured = measured_from_e2e({"a": 3000.0, "b": 1000.0, "c": 1000.0, "d": 1000.0})
    shards = split(cases, 2, measured)
    assert {tuple(c.id for c in s) for s in shards} == {("a",), ("b", "c", "d")}


def test_measured_from_e2e_counts_every_run_and_the_load() -> None:
    assert measured_from_e2e({"a": 100.0}, runs_per_case=6, load_ms={"a": 400.0}) == {"a": 1.0}
    assert measured_from_e2e({"a": 0.0, "b": 50.0}) == {"b": 0.05}


times = st.lists(
    st.one_of(st.none(), st.floats(min_value=0.01, max_value=500.0)), min_size=0, max_size=30
)


@settings(max_examples=150, deadline=None)
@given(times=times, total=st.integers(min_value=1, max_value=9), seed=st.integers(0, 1000))
def test_every_case_is_in_exactly_one_shard_and_the_split_ignores_input_order(
    times: list[float | None], total: int, seed: int
) -> None:
    cases = [case(f"case_{i:02d}", t) for i, t in enumerate(times)]
    shards = [select_shard(cases, Shard(k, total)) for k in range(1, total + 1)]
    ids = [c.id for s in shards for c in s]
    assert sorted(ids) == sorted(c.id for c in cases)  # covered, and no case twice

    shuffled = list(cases)
    random.Random(seed).shuffle(shuffled)
    again = split(shuffled, total)
    assert [{c.id for c in s} for s in again] == [{c.id for c in s} for s in shards]

    # Greedy LPT: the fullest shard got its last case when it was the emptiest, so no
    # two shards differ by more than the longest case.
    loads = [sum(expected_time_s(c) for c in s) for s in shards]
    longest = max((expected_time_s(c) for c in cases), default=0.0)
    assert max(loads) - min(loads) <= longest + 1e-9


# ---- through the CLI: shards of `check`, merged, equal one unsharded check ------------------

FAKE_PIPE = """
import os
import time

import torch

from perfguard.device.timer import stage, step


def pipeline(case, platform):
    if "broken" in case.id:
        raise RuntimeError("this case cannot build its pipeline")
    slow = case.id in os.environ.get("PG_SLOW_CASES", "").split(",")

    def run():
        with stage("TextEncodingStage"):
            time.sleep(0.005)
        with stage("DenoisingStage"):
            for i in range(2):
                with step(i):
                    time.sleep(0.02 + (0.08 if slow and i == 1 else 0.0))
        return torch.zeros(2)

    return run
"""

REGISTRY = "".join(
    f'[[case]]\nid = "{cid}"\nworkload = "qwen_image"\npreset = "tiny"\n'
    f"estimated_time_s = {est}\n\n"
    for cid, est in [("a_fast", 1.0), ("b_slowed", 3.0), ("c_fast", 2.0), ("d_broken", 1.0),
                     ("e_new", 0.5)]
)  # fmt: skip


def verdicts(report_path: Path) -> dict[str, tuple[str, dict[str, str]]]:
    from perfguard.storage.reports import read_report

    # An improvement never fails a check and, on stages that sleep a millisecond, comes and
    # goes with the machine's load between two checks: it counts as a pass here.
    def v(verdict: str) -> str:
        return "pass" if verdict == "improvement" else verdict

    report = read_report(report_path)
    return {
        c.case_id: (v(c.verdict), {m.metric: v(m.verdict) for m in c.metrics}) for c in report.cases
    }


def test_merged_shard_reports_give_the_verdicts_and_exit_code_of_one_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pg: Callable[..., tuple[int, str, str]]
) -> None:
    from perfguard.storage.reports import read_report

    (tmp_path / "registry").mkdir()
    (tmp_path / "registry" / "cpu.toml").write_text(REGISTRY)
    (tmp_path / "pg_shard_pipe.py").write_text(FAKE_PIPE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.delenv("PERFGUARD_FACTORY", raising=False)
    # The pipelines sleep, so a busy spell of the machine cannot slow them; the reference
    # workload would still read it and call a case contended in one check and not in the
    # other. A steady reading keeps this test on what it asks: shards give one verdict.
    monkeypatch.setattr("perfguard.device.reference.Reference.time_ms", lambda self: 1.0)
    select_args = ["--platform", "cpu", "--cases", "registry", "--baseline", "base.json"]
    common = [*select_args, "--factory", "pg_shard_pipe:pipeline", "--repeats", "3"]

    assert pg("gen-baselines", *common, "--case", "a_fast", "--case", "b_slowed",
              "--case", "c_fast", "--processes", "1")[0] == 0  # fmt: skip
    monkeypatch.setenv("PG_SLOW_CASES", "b_slowed")
    # Confirmations run in fresh processes, which the steady reading above does not reach:
    # there the real reference reads contended, and an unconfirmed slowdown is no verdict.
    check = [*common, "--max-reruns", "0"]

    assert pg("check", *check, "--report", "full.json")[0] == 1
    for k in (1, 2, 3):
        code, _, _ = pg("check", *check, "--shard", f"{k}/3", "--report", f"r{k}.json")
        assert code == read_report(tmp_path / f"r{k}.json").exit_code
    assert pg("merge", "r1.json", "r2.json", "r3.json", "--out", "merged.json")[0] == 1

    full, merged = verdicts(tmp_path / "full.json"), verdicts(tmp_path / "merged.json")
    assert merged == full
    assert full["b_slowed"][0] == "regression" and full["a_fast"][0] == "pass"
    assert full["d_broken"][0] == "error" and full["e_new"][0] == "missing-baseline"
    shards = [set(verdicts(tmp_path / f"r{k}.json")) for k in (1, 2, 3)]
    assert sum(len(s) for s in shards) == len(full)  # disjoint, and together every case

    # `list-cases --shard` lists what each shard's `check` ran.
    for k, ids in enumerate(shards, start=1):
        code, out, _ = pg("list-cases", *select_args, "--shard", f"{k}/3", "--json")
        assert code == 0 and {c["id"] for c in json.loads(out)} == ids
