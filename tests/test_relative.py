"""The relative check: paired decisions, the block schedule, reports, and the command.

The schedule and the decision are tested on a virtual clock: `run_relative` takes the
measurement of a block as a function, and here it is one whose stages last what the
test says (a drift shared by the two processes of a block, noise of each process and
each run), so the statistics are checked on known effects, whatever else the machine is
doing. The command is then run for real (fresh processes, import paths, git worktrees) on
pipelines whose stages advance a virtual clock by a known amount: on this shared 2-core
runner even a `time.sleep(0.005)` lasts 5.5-7 ms under load, which is a verdict on the
machine, not on the check.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from perfguard.decision import paired
from perfguard.decision.estimate import DIFFERENT, SAME, UNKNOWN, paired_estimate
from perfguard.decision.looks import alpha_per_look, look_points
from perfguard.decision.options import RELATIVE_JUDGING
from perfguard.decision.paired import judge_relative_metric
from perfguard.decision.records import IMPROVEMENT, PASS, REGRESSION, MetricVerdict
from perfguard.decision.tolerances import relative_pad
from perfguard.errors import PerfguardError
from perfguard.measurement import checkout, relative
from perfguard.measurement.base_revision import Base, case_for_base
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.paired_blocks import base_side, head_side
from perfguard.presentation.markdown import escape_md, render_markdown
from perfguard.presentation.summary import summary_line
from perfguard.results import CaseResult
from perfguard.storage.cases import Case
from perfguard.storage.reports import Report, build_relative, merge, read_report, write_report
from tests.helpers import FACTORY, QUICK, VIRTUAL_PIPES, git_in, worktrees

PG = Callable[..., tuple[int, str, str]]

REPO = Path(__file__).resolve().parent.parent

# ---- the paired decision -------------------------------------------------------------------


def test_paired_estimate_gives_three_answers() -> None:
    rng = random.Random(1)
    noisy = [math.log(1.08) + rng.gauss(0, 0.01) for _ in range(8)]
    est = paired_estimate(noisy, 0.03, 0.001)
    assert est.decision == DIFFERENT and est.slower and est.low > 1.0 and est.ratio > 1.03
    same = [rng.gauss(0, 0.005) for _ in range(8)]
    assert paired_estimate(same, 0.03, 0.001).decision == SAME
    # 2 % slower: not the 3 % that matters, not credibly within it either with this spread.
    small = [math.log(1.02) + rng.gauss(0, 0.02) for _ in range(6)]
    assert paired_estimate(small, 0.03, 0.001).decision == UNKNOWN
    faster = [math.log(0.9) + rng.gauss(0, 0.01) for _ in range(6)]
    est = paired_estimate(faster, 0.03, 0.001)
    assert est.decision == DIFFERENT and not est.slower and est.high < 1.0


def test_a_slowdown_above_the_minimum_effect_but_not_credible_is_unknown() -> None:
    # 6 % on average, but the blocks disagree wildly: not credibly slower than 1.
    est = paired_estimate([0.30, -0.20, 0.15, -0.05], 0.03, 0.002)
    assert est.ratio > 1.03 and est.low < 1.0 and est.decision == UNKNOWN


def test_relative_metric_verdicts_and_unresolved_note() -> None:
    base = [10.0] * 8
    slow = judge_relative_metric(
        "stage:DenoisingStage", [10.8] * 8, base, [math.log(1.08) + d for d in (0.01, -0.01) * 3],
        alpha=0.002,
    )  # fmt: skip
    assert slow.verdict == REGRESSION and slow.significant and "credibly" in slow.reason
    fast = judge_relative_metric(
        "e2e", [8.0] * 8, base, [math.log(0.8) + d for d in (0.01, -0.01) * 3], alpha=0.002
    )
    assert fast.verdict == IMPROVEMENT
    open_ = judge_relative_metric(
        "e2e", [10.2] * 8, base, [math.log(1.02) + d for d in (0.03, -0.03) * 3], alpha=0.002
    )
    assert open_.verdict == PASS and open_.paired is not None
    assert open_.paired.decision == UNKNOWN and "can't tell" in open_.reason
    assert judge_relative_metric("e2e", None, base, [], alpha=0.01).verdict == "missing-stage"
    assert judge_relative_metric("e2e", base, None, [], alpha=0.01).verdict == "new-stage"


def test_a_difference_within_the_timer_floor_is_no_regression() -> None:
    """A 5 us stage read 1.33x in every block: 2 us, below the 10 us CPU floor."""
    stage, ratios = "stage:InputValidationStage", [math.log(1.33) + d for d in (0.02, -0.02) * 6]
    args = (stage, [0.0067] * 12, [0.005] * 12, ratios)
    assert judge_relative_metric(*args, alpha=0.002).verdict == REGRESSION  # no floor
    floored = judge_relative_metric(*args, alpha=0.002, pad=relative_pad(stage, "cpu"))
    assert floored.verdict == PASS and floored.clear  # the interval lies inside the floor
    # The same ratio on a 10 ms stage is 3.3 ms: far above any floor.
    big = judge_relative_metric(stage, [13.3] * 12, [10.0] * 12, ratios, alpha=0.002, pad=0.01)
    assert big.verdict == REGRESSION
    assert relative_pad("e2e", "cuda") == 0.05 and relative_pad("peak_memory", "cpu") == 0.1


def test_the_per_step_metrics_share_alpha_as_one_family() -> None:
    """Step 0 reads 1.2x with a spread that clears alpha alone but not alpha / 10."""

    def side(step0: float, steps: int) -> CaseResult:
        res = CaseResult("c", repeats=1)
        res.samples = {f"step:{i}": [step0 if i == 0 else 1.0] for i in range(steps)}
        return res

    levels = paired.LookLevels(0.01, (12,))
    assert (
        levels.of("step:0", 10) < levels.alpha_look / 5
        and levels.of("e2e", 10) == levels.alpha_look
    )
    for steps, verdict in ((10, PASS), (1, REGRESSION)):
        blocks = [
            paired.Block(
                "BH",
                1.0,
                {"B": {"c": side(1.0, steps)}, "H": {"c": side(1.2 * math.exp(d), steps)}},
            )
            for d in (0.09, -0.09) * 6
        ]
        xs = paired.log_ratios(blocks, "c", "step:0")
        assert paired_estimate(xs, 0.10, levels.alpha_look).slower  # the premise
        assert not paired_estimate(xs, 0.10, levels.of("step:0", 10)).slower
        judgement, _ = paired.judge_blocks(["c"], blocks, levels=levels, final=True)
        by = {m.metric: m for m in judgement.cases[0].metrics}
        assert by["step:0"].verdict == verdict, (steps, by["step:0"].reason)


def test_look_schedule_and_the_level_per_look() -> None:
    looks = look_points(4, 24)
    assert looks == (4, 6, 8, 12, 16, 24)
    for schedule in (looks, (8,)):
        level = alpha_per_look(0.01, schedule)
        assert 0 < level < 0.005 and alpha_per_look(0.01, schedule) == level
        # The family-wise rate of noise crossing at some look, measured through
        # `paired_estimate` itself on other random numbers than the level's own: at most
        # alpha less the budget look's share, give or take three Monte Carlo errors.
        rng, checks, crossed = random.Random(5), 6000, 0
        for _ in range(checks):
            xs = [rng.gauss(0.0, 0.03) for _ in range(schedule[-1])]
            crossed += any(paired_estimate(xs[:n], 0.0, level).low > 1.0 for n in schedule)
        assert crossed / checks <= 0.01 - level + 3 * math.sqrt(0.01 / checks), (schedule, crossed)
    assert look_points(2, 5) == (2, 4, 5)
    with pytest.raises(PerfguardError, match="--min-blocks"):
        look_points(1, 4)
    with pytest.raises(PerfguardError, match="--max-blocks"):
        look_points(6, 4)


def test_block_orders_come_in_mirrored_pairs_from_the_seed() -> None:
    def orders(seed: int) -> list[str]:
        rng, out, prev = random.Random(seed), [], None
        for i in range(12):
            prev = relative.block_order(i, prev, rng)
            out.append(prev)
        return out

    got = orders(7)
    assert got == orders(7)
    assert all(got[i + 1] == got[i][::-1] for i in range(0, 12, 2))
    assert {got[i] for i in range(0, 12, 2)} == {"BH", "HB"}  # drawn, not fixed


# ---- the schedule on a virtual clock ------------------------------------------------------


NORMALIZED = paired.BlockComparison("normalized")
CASE = Case(id="sleepy", workload="qwen_image", preset="tiny")
OTHER = Case(id="other", workload="qwen_image", preset="tiny")


class VirtualBlocks:
    """Blocks whose figures are known: `slow` (head / base) per stage, a drift shared by
    the block's two processes, and noise of each process and each run; each block moves
    the virtual clock by `block_s`."""

    def __init__(
        self,
        slow: Mapping[str, float] | None = None,
        *,
        drift: float = 0.05,
        process: float = 0.01,
        run: float = 0.01,
        seed: int = 0,
        block_s: float = 10.0,
        fail: Mapping[tuple[str, str], int] | None = None,
    ) -> None:
        self.slow = dict(slow or {})
        self.drift, self.process, self.run = drift, process, run
        self.rng = random.Random(seed)
        self.now = 0.0
        self.block_s = block_s
        self.fail = dict(fail or {})
        self.calls: list[tuple[int, str, list[str]]] = []

    def clock(self) -> float:
        return self.now

    def __call__(
        self, index: int, order: str, cases: Sequence[Case]
    ) -> dict[str, dict[str, CaseResult]]:
        self.calls.append((index, order, [c.id for c in cases]))
        shared = math.exp(self.rng.gauss(0, self.drift))
        out: dict[str, dict[str, CaseResult]] = {"B": {}, "H": {}}
        for case in cases:
            for side in order:
                if self.fail.get((case.id, side)) == index:
                    out[side][case.id] = CaseResult(case.id, "error", error="boom")
                    continue
                own = shared * math.exp(self.rng.gauss(0, self.process))
                res = CaseResult(case.id, repeats=5, warmup=1, output_hash="abc")
                for _ in range(5):
                    den = 20.0 * own * math.exp(self.rng.gauss(0, self.run))
                    dec = 5.0 * own * math.exp(self.rng.gauss(0, self.run))
                    if side == "H":
                        den *= self.slow.get("DenoisingStage", 1.0)
                        dec *= self.slow.get("DecodingStage", 1.0)
                    for name, value in (
                        ("stage:DenoisingStage", den),
                        ("stage:DecodingStage", dec),
                        ("e2e", den + dec + 0.5),
                    ):
                        res.samples.setdefault(name, []).append(value)
                res.deterministic = True
                out[side][case.id] = res
        self.now += self.block_s
        return out


def run_virtual(blocks: VirtualBlocks, cases: Sequence[Case] = (CASE,), **kw: object) -> object:
    schedule = {k: kw.pop(k) for k in ("min_blocks", "max_blocks", "budget_s") if k in kw}
    plan = relative.Schedule(seed=3, **schedule)  # type: ignore[arg-type]
    return relative.run_relative(cases, blocks, plan, clock=blocks.clock, **kw)  # type: ignore[arg-type]


def verdicts(outcome: object, case_id: str = "sleepy") -> dict[str, str]:
    (case,) = [c for c in outcome.judgement.cases if c.case_id == case_id]  # type: ignore[attr-defined]
    return {m.metric: m.verdict for m in case.metrics}


def test_unchanged_code_passes_and_stops_once_everything_is_clearly_the_same() -> None:
    blocks = VirtualBlocks(drift=0.05, process=0.005, run=0.01)
    outcome = run_virtual(blocks, budget_s=1000)
    assert outcome.judgement.exit_code == 0  # type: ignore[attr-defined]
    assert set(verdicts(outcome).values()) == {PASS}
    assert outcome.stopped == "resolved"  # type: ignore[attr-defined]
    assert len(outcome.blocks) < relative.DEFAULT_MAX_BLOCKS  # type: ignore[attr-defined]


def test_a_head_five_percent_slower_in_denoising_fails_despite_a_large_shared_drift() -> None:
    # The drift shared by a block (8 %) is larger than the slowdown; it cancels in the pairs.
    blocks = VirtualBlocks({"DenoisingStage": 1.05}, drift=0.08, process=0.005, run=0.01)
    outcome = run_virtual(blocks, budget_s=1000)
    got = verdicts(outcome)
    assert got["stage:DenoisingStage"] == REGRESSION and got["e2e"] == REGRESSION
    assert got["stage:DecodingStage"] == PASS
    assert outcome.judgement.exit_code == 1  # type: ignore[attr-defined]


def test_a_small_open_effect_the_blocks_could_resolve_is_below_resolution() -> None:
    """At the budget, +2 % that eight blocks of 3 % noise could only have caught at +13 %:
    below the resolution they reached (exit 0), never same; `gate` can't tell (exit 4)."""
    blocks = VirtualBlocks({"DenoisingStage": 1.02}, drift=0.05, process=0.03, block_s=10)
    outcome = run_virtual(blocks, budget_s=95, min_blocks=4, max_blocks=24)
    (case,) = outcome.judgement.cases  # type: ignore[attr-defined]
    den = {m.metric: m for m in case.metrics}["stage:DenoisingStage"]
    assert den.answer is not None and den.answer.answer == "unresolved"
    assert den.answer.resolution is not None and den.answer.resolution > 4 / 3 * 0.03
    assert outcome.judgement.exit_code == 0  # type: ignore[attr-defined]


def test_a_small_open_effect_runs_to_the_budget_and_cannot_tell() -> None:
    blocks = VirtualBlocks({"DenoisingStage": 1.02}, drift=0.05, process=0.03, block_s=10)
    judging = RELATIVE_JUDGING.replace(timing_gate="gate")
    outcome = run_virtual(blocks, budget_s=95, min_blocks=4, max_blocks=24, judging=judging)
    assert outcome.stopped == "budget"  # type: ignore[attr-defined]
    # 10 s blocks, in pairs: after 8 blocks (80 s) the next pair would end past 95 s.
    assert len(outcome.blocks) == 8  # type: ignore[attr-defined]
    (case,) = outcome.judgement.cases  # type: ignore[attr-defined]
    den = {m.metric: m for m in case.metrics}["stage:DenoisingStage"]
    assert den.verdict == PASS and den.paired.decision == UNKNOWN
    assert den.answer is not None and den.answer.answer == "cant_tell"
    # no verdict on the code: exit 4, and the first line says so
    assert outcome.judgement.exit_code == 4  # type: ignore[attr-defined]
    report = _report(outcome)
    assert summary_line(report).startswith("perfguard CAN'T TELL")
    assert "#### Can't tell" in render_markdown(report)


def test_the_minimum_blocks_run_even_past_the_budget() -> None:
    blocks = VirtualBlocks({"DenoisingStage": 1.02}, process=0.03, block_s=100)
    outcome = run_virtual(blocks, budget_s=1, min_blocks=4)
    assert len(outcome.blocks) == 4 and outcome.stopped == "budget"  # type: ignore[attr-defined]


def test_a_case_that_fails_on_one_side_is_an_error_and_the_others_go_on() -> None:
    blocks = VirtualBlocks(fail={("other", "B"): 1})
    outcome = run_virtual(blocks, cases=(CASE, OTHER), budget_s=1000)
    by_id = {c.case_id: c for c in outcome.judgement.cases}  # type: ignore[attr-defined]
    assert by_id["other"].verdict == "error" and by_id["other"].error == "base: boom"
    assert by_id["sleepy"].verdict == PASS
    assert outcome.judgement.exit_code == 3  # type: ignore[attr-defined]
    assert all(ids == ["sleepy"] for i, _, ids in blocks.calls if i >= 2)


class SpellBlocks(VirtualBlocks):
    """VirtualBlocks whose every process also lands in its own spell of the runner (sd
    `spell`, not shared with the other side of its block) that slows its runs and the
    reference workload timed beside each alike, as a shared CPU runner does; with `own`,
    each process's reference readings also move on their own (sd `own`), its runs not:
    a quiet runner, where the reference moved by ~8 % between processes and the stages
    did not follow it."""

    def __init__(
        self,
        slow: Mapping[str, float] | None = None,
        *,
        spell: float,
        own: float = 0.0,
        **kw: Any,
    ) -> None:
        super().__init__(slow, drift=0.0, **kw)
        self.spell, self.own = spell, own

    def __call__(
        self, index: int, order: str, cases: Sequence[Case]
    ) -> dict[str, dict[str, CaseResult]]:
        out = super().__call__(index, order, cases)
        for side in order:
            for res in out[side].values():
                if res.status != "ok":
                    continue
                speed = math.exp(self.rng.gauss(0, self.spell))
                for metric, xs in res.samples.items():
                    res.samples[metric] = [x * speed for x in xs]
                res.samples["peak_memory"] = [1e6] * res.repeats  # not the runner's speed
                reads = speed * (math.exp(self.rng.gauss(0, self.own)) if self.own else 1.0)
                res.reference = [
                    4.0 * reads * math.exp(self.rng.gauss(0, 0.005)) for _ in range(res.repeats)
                ]
        return out


def test_normalized_timing_divides_out_a_spell_that_moved_one_side_of_a_block() -> None:
    # Each process in its own spell (15 %): raw, the blocks' ratios scatter too much to
    # resolve a 5 % slowdown in 24 blocks; each run divided by its reference, it fails.
    raw = run_virtual(SpellBlocks({"DenoisingStage": 1.05}, spell=0.15), budget_s=1000)
    assert verdicts(raw)["stage:DenoisingStage"] == PASS
    normalized = run_virtual(
        SpellBlocks({"DenoisingStage": 1.05}, spell=0.15),
        budget_s=1000,
        comparison=NORMALIZED,
    )
    found = verdicts(normalized)
    assert found["stage:DenoisingStage"] == REGRESSION and found["stage:DecodingStage"] == PASS
    # Unchanged code under the same spells: clearly the same, normalized.
    same = run_virtual(SpellBlocks(spell=0.15), budget_s=1000, comparison=NORMALIZED)
    assert same.judgement.exit_code == 0 and same.stopped == "resolved"  # type: ignore[attr-defined]


def test_normalized_log_ratios_scale_only_timings_and_only_runs_with_reference_times() -> None:
    blocks = [
        paired.Block("BH", 1.0, SpellBlocks(spell=0.2, seed=s)(0, "BH", [CASE])) for s in range(6)
    ]
    for metric in ("stage:DenoisingStage", "peak_memory"):
        raw = paired.log_ratios(blocks, CASE.id, metric)
        norm = paired.log_ratios(blocks, CASE.id, metric, "normalized")
        if metric == "peak_memory":  # memory is not divided by the reference
            assert norm == raw == [0.0] * len(blocks)
        else:
            assert max(map(abs, norm)) < 0.05 < max(map(abs, raw))
    for block in blocks:  # no reference times (an older base, a virtual clock): raw
        block.results["B"][CASE.id].reference = None
    assert paired.log_ratios(blocks, CASE.id, "e2e", "normalized") == paired.log_ratios(
        blocks, CASE.id, "e2e"
    )


def test_normalized_timing_scales_by_the_share_of_the_reference_fitted_on_the_check() -> None:
    """Divided whole, a process whose reference reads fast on its own moves the stage's
    ratio by as much; the share fitted on the check's runs is ~0 here, and a 5 %
    slowdown that the whole division buries in the reference's scatter is caught."""
    metric = "stage:DenoisingStage"
    blocks = [
        paired.Block(
            "BH", 1.0, SpellBlocks(spell=0.0, own=0.08, process=0.005, seed=s)(0, "BH", [CASE])
        )
        for s in range(12)
    ]
    assert paired.reference_exponent(paired._block_pairs(blocks, CASE.id, metric), metric) < 0.2
    whole = []
    for block in blocks:
        h = paired.per_reference(block.results["H"][CASE.id], metric)
        b = paired.per_reference(block.results["B"][CASE.id], metric)
        assert h is not None and b is not None
        whole.append(math.log(statistics.median(h) / statistics.median(b)))
    fitted = paired.log_ratios(blocks, CASE.id, metric, NORMALIZED)
    raw = paired.log_ratios(blocks, CASE.id, metric)
    assert statistics.stdev(fitted) < 0.3 * statistics.stdev(whole)
    assert statistics.stdev(fitted) < 1.2 * statistics.stdev(raw)
    slowed = SpellBlocks({"DenoisingStage": 1.05}, spell=0.0, own=0.08, process=0.005)
    outcome = run_virtual(slowed, budget_s=1000, comparison=NORMALIZED)
    (case,) = outcome.judgement.cases  # type: ignore[attr-defined]
    stage = next(m for m in case.metrics if m.metric == metric)
    assert stage.verdict == REGRESSION
    # The report names the share each figure was scaled by, and reads it back.
    assert stage.paired is not None and stage.paired.reference_exponent < 0.2
    data = stage.to_json()
    assert data["paired"]["reference_exponent"] == round(stage.paired.reference_exponent, 3)
    again = MetricVerdict.from_json(metric, data).paired
    assert again is not None and again.reference_exponent == data["paired"]["reference_exponent"]


def test_false_alarms_of_unchanged_code_stay_under_alpha_over_repeated_looks() -> None:
    """200 A/A checks (6 metrics each, looked at up to 6 times): alpha is 1 % per metric.

    Looking six times at 1 % would fail roughly one metric in twenty of these; at the
    level per look (`alpha_per_look`) the rate of failing checks is what the docs promise.
    """
    alarms = 0
    for seed in range(200):
        blocks = VirtualBlocks(drift=0.05, process=0.02, run=0.01, seed=seed, block_s=1)
        plan = relative.Schedule(budget_s=1e9, max_blocks=24, seed=seed)
        outcome = relative.run_relative((CASE, OTHER), blocks, plan, clock=blocks.clock)
        alarms += outcome.judgement.exit_code == 1
    assert alarms <= 2, alarms


def _report(outcome: object, commit: str = "a" * 40) -> Report:
    against = {"dir": "/tmp/base", "commit": commit, "ref": None, **outcome.summary()}  # type: ignore[attr-defined]
    return build_relative(
        outcome.judgement,  # type: ignore[attr-defined]
        environment={"platform": "cpu", "hardware": "test-cpu", "git_commit": "b" * 40},
        against=against,
        settings={"source": "relative", "inject": None},
    )


# ---- reports ----------------------------------------------------------------------------------


def test_a_relative_report_validates_round_trips_merges_and_enters_history(
    tmp_path: Path, pg: PG
) -> None:
    slow = run_virtual(VirtualBlocks({"DenoisingStage": 1.08}), budget_s=1000)
    same = run_virtual(VirtualBlocks(seed=5), cases=(OTHER,), budget_s=1000)
    first, second = _report(slow), _report(same)
    write_report(tmp_path / "a.json", first)
    write_report(tmp_path / "b.json", second)
    back = read_report(tmp_path / "a.json")
    assert back.relative and back.against["commit"] == "a" * 40  # type: ignore[index]
    assert back.to_json()["cases"] == json.loads((tmp_path / "a.json").read_text())["cases"]
    text = render_markdown(back)
    assert "relative to /tmp/base (commit aaaaaaaaaaaa)" in text
    assert "#### Regressions" in text and "stage:DenoisingStage" in text
    assert "gen-baselines --tighten" not in text
    paths = [str(tmp_path / n) for n in ("a.json", "b.json")]
    code, out, err = pg("merge", *paths, "--out", str(tmp_path / "m.json"))
    assert code == 1, out + err
    merged = read_report(tmp_path / "m.json")
    assert merged.relative and {c.case_id for c in merged.cases} == {"sleepy", "other"}
    code, out, err = pg("history", "add", str(tmp_path / "m.json"), "--db", str(tmp_path / "h.db"))
    assert code == 0, out + err
    code, out, err = pg("history", "show", "--db", str(tmp_path / "h.db"), "--json")
    assert code == 0 and "stage:DenoisingStage" in out


def test_merge_refuses_reports_against_different_bases() -> None:
    a = _report(run_virtual(VirtualBlocks(), budget_s=1000))
    b = _report(run_virtual(VirtualBlocks(seed=2), cases=(OTHER,), budget_s=1000), "c" * 40)
    with pytest.raises(PerfguardError, match="base commit"):
        merge([a, b], ["a.json", "b.json"])


# ---- the command, in processes -----------------------------------------------------------------


def test_unchanged_code_passes_against_a_base_directory(
    project: Path, pg: PG, tmp_path: Path
) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "pg_rel_pipes.py").write_text(VIRTUAL_PIPES.format(slow=1.0))
    code, out, err = pg(
        "compare", *QUICK, *FACTORY, "--against", str(base), "--min-blocks", "2",
        "--max-blocks", "2", "--report", "r.json", "--markdown", "r.md",
        "--write-baseline", "base.json",
    )  # fmt: skip
    report = json.loads(Path("r.json").read_text())
    # Two blocks cannot show the same within 3 % (t on one degree of freedom): unchanged
    # code is never slower, and its figures say how little two blocks could see (below
    # resolution, exit 0, where they could not catch 4/3 of the minimum effect).
    answer = report["answer"]
    assert code in (0, 4) and answer in ("same", "cant_tell", "unresolved"), out + err
    assert (code == 4) == (answer == "cant_tell")
    assert report["against"]["dir"] == str(base.resolve()) and report["against"]["commit"] is None
    assert report["settings"]["source"] == "relative" and report["profile"]["name"] == "relative"
    assert report["settings"]["timing"] == "normalized"  # the CPU default
    assert escape_md(f"relative to {base.resolve()} (no commit)") in Path("r.md").read_text()
    case = report["cases"]["qwen_image_t2i_smoke"]
    assert case["sampling"]["blocks"] == report["against"]["blocks"] >= 2
    assert case["metrics"]["stage:DenoisingStage"]["verdict"] == "pass"
    # The base side's measurement, as a baseline a stored check can use.
    saved = json.loads(Path("base.json").read_text())
    den = saved["scenarios"]["qwen_image_t2i_smoke"]["stages"]["DenoisingStage"]
    assert 19.0 < den["median"] < 26.0 and len(den["processes"]) == report["against"]["blocks"]
    code, out, err = pg("baselines", "validate", "base.json")
    assert code == 0, out + err


def test_both_sides_fork_from_one_server_and_import_their_own_code(
    project: Path, pg: PG, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forks of one server share an offset: one server a side put it between the sides
    of every block. Both sides' workers are children of one server, each side's
    pipeline module its own."""
    log = tmp_path / "forks.log"
    monkeypatch.setenv("PG_REL_LOG", str(log))
    logged = VIRTUAL_PIPES.replace(
        "def pipeline(case, platform):\n",
        "def pipeline(case, platform):\n"
        "    with open(os.environ['PG_REL_LOG'], 'a') as fh:\n"
        "        fh.write(f'{{__file__}} {{os.getppid()}}\\n')\n",
    )
    base = tmp_path / "base"
    base.mkdir()
    for where in (base, project):
        (where / "pg_rel_pipes.py").write_text(logged.format(slow=1.0))
    code, _, _ = pg(
        "compare", *QUICK, *FACTORY, "--against", str(base), "--min-blocks", "2",
        "--max-blocks", "2", "--start-method", "forkserver", "--report", "r.json",
    )  # fmt: skip
    assert code in (0, 4) and json.loads(Path("r.json").read_text())["answer"] != "slower"
    forks = [line.split() for line in log.read_text().splitlines()]
    files = sorted({Path(f).parent for f, _ in forks})
    assert files == sorted([base, project]) and len(forks) == 4
    (parent,) = {int(pid) for _, pid in forks}
    assert parent != os.getpid()


def test_a_head_slowed_by_a_few_percent_fails_against_its_merge_base(project: Path, pg: PG) -> None:
    """--against REF: a temporary worktree of HEAD is the base; the working tree (8 %
    slower in its denoising steps) is the head. The worktree is gone afterwards. (At
    5 %, a noncentral t, computed by hand, put a miss by four blocks of the virtual
    pipelines' noise near 0.3 %.)"""
    (project / "pg_rel_pipes.py").write_text(VIRTUAL_PIPES.format(slow=1.08))
    sha = git_in(project, "rev-parse", "HEAD")
    # --timing raw: the figures judged are the stages' own, and the report says so.
    code, out, err = pg(
        "compare", *QUICK, *FACTORY, "--against", "HEAD", "--timing", "raw",
        "--min-blocks", "4", "--max-blocks", "4", "--report", "r.json", "--markdown", "r.md",
    )  # fmt: skip
    report = json.loads(Path("r.json").read_text())
    metrics = report["cases"]["qwen_image_t2i_smoke"]["metrics"]
    assert code == 1, out + err + json.dumps(metrics)
    den = metrics["stage:DenoisingStage"]
    assert den["verdict"] == "regression" and den["ratio_low"] > 1 and den["ratio"] > 1.03
    assert report["against"]["commit"] == sha and report["against"]["ref"] == "HEAD"
    assert report["settings"]["timing"] == "raw"
    # The counts are exact: the first two blocks count them, the other two only time.
    assert report["cases"]["qwen_image_t2i_smoke"]["work"]["runs"] == 2
    assert f"relative to HEAD (commit {sha[:12]})" in Path("r.md").read_text()
    assert len(worktrees(project)) == 1


# ---- bad input ----------------------------------------------------------------------------------


def fake_perfguard(
    root: Path, *, version: str = "0.0.9", protocol: int | None = 1, drop: str = ""
) -> Path:
    """A base whose perfguard package is only what the probe reads (no torch, no runner)."""
    pkg = root / "perfguard"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (pkg / "_worker.py").write_text("" if protocol is None else f"WORKER_PROTOCOL = {protocol}\n")
    import dataclasses

    fields = [f for f in dataclasses.fields(Case) if f.name != drop]
    lines = ["import dataclasses", "", "@dataclasses.dataclass", "class Case:"]
    lines += [f"    {f.name}: object = None" for f in fields]
    (pkg / "cases.py").write_text("\n".join(lines) + "\n")
    names = ("platform", "repeats", "warmup", "timeout", "sync", "inject", "factory")
    (pkg / "workers.py").write_text(
        "import dataclasses\n\n@dataclasses.dataclass\nclass RunOptions:\n"
        + "".join(f"    {n}: object = None\n" for n in names)
    )
    return root


def one_line_error(code: int, err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, err
    return lines[0]


def refused_compare(pg: PG, *args: str) -> str:
    """`compare *args --report r.json`, refused in one line with exit 2 and no report:
    that line."""
    code, _, err = pg("compare", *QUICK, *args, "--report", "r.json")
    line = one_line_error(code, err)
    assert not Path("r.json").exists()
    return line


def test_a_missing_directory_is_one_line_and_exit_2(project: Path, pg: PG) -> None:
    assert "--against ./nowhere: no such directory" in refused_compare(pg, "--against", "./nowhere")


def test_a_directory_that_does_not_provide_the_code_is_refused(
    project: Path, pg: PG, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    line = refused_compare(pg, *FACTORY, "--against", str(empty))
    assert "not importable as the base" in line and "pg_rel_pipes" in line


def test_an_incompatible_worker_protocol_names_both_versions(
    project: Path, pg: PG, tmp_path: Path
) -> None:
    base = fake_perfguard(tmp_path / "old", protocol=99)
    line = refused_compare(pg, "--against", str(base))
    assert "perfguard 0.0.9 speaks worker protocol 99" in line and "this perfguard 0.1.0" in line


def test_an_unknown_case_field_names_both_versions_and_writes_nothing(
    project: Path, pg: PG, tmp_path: Path
) -> None:
    base = fake_perfguard(tmp_path / "old", drop="estimated_time_s")
    code, _out, err = pg(
        "compare",
        *QUICK,
        "--against",
        str(base),
        "--report",
        "r.json",
        "--write-baseline",
        "b.json",
    )
    line = one_line_error(code, err)
    assert "sets estimated_time_s = 0.3" in line and "0.0.9" in line and "0.1.0" in line
    assert not Path("r.json").exists() and not Path("b.json").exists()


def test_a_field_at_its_default_is_dropped_for_an_older_base(tmp_path: Path) -> None:
    base = Base(
        root=tmp_path, import_dir=tmp_path, commit=None, dirty=None, version="0.0.9",
        protocol=1, perfguard_file=None,
        case_fields=frozenset(f for f in CASE.to_json() if f != "tolerance_overrides"),
        option_fields=frozenset(),
    )  # fmt: skip
    assert "tolerance_overrides" not in case_for_base(CASE, base)


def test_only_the_first_blocks_count_the_work_unless_the_base_cannot_be_told() -> None:
    options = MeasureOptions(repeats=3)
    head = head_side(options, "cpu", env={})
    assert [head.for_block(i)[0].count_work for i in range(4)] == [True, True, False, False]
    assert head.for_block(3)[1]["count_work"] is False and "count_work" not in head.for_block(0)[1]
    fields = {f.name for f in dataclasses.fields(MeasureOptions)} | {"platform"}
    for known, counts_later in ((fields, False), (fields - {"count_work"}, True)):
        base = Base(
            root=Path("."), import_dir=Path("."), commit=None, dirty=None, version="0.0.9",
            protocol=1, perfguard_file=None, case_fields=frozenset(),
            option_fields=frozenset(known),
        )  # fmt: skip
        later_options, later_json = base_side(options, base, "cpu", env={}).for_block(5)
        assert later_options.count_work is counts_later
        assert ("count_work" in later_json) is not counts_later


def test_options_of_the_stored_gate_are_not_options_of_compare(project: Path, pg: PG) -> None:
    """compare has no baseline, confirmations or profile; check has no base or timing."""
    for flag, value in (("--baseline", "b.json"), ("--confirm-gap-s", "3"), ("--profile", "x")):
        code, _, err = pg("compare", *QUICK, "--against", ".", flag, value)
        assert code == 2 and f"No such option '{flag}'" in err
    code, _, err = pg("check", *QUICK, "--timing", "raw")
    assert code == 2 and "--timing moved: use `perfguard compare --timing" in err
    code, _, err = pg("compare", *QUICK, "--against", ".", "--timing", "scaled")
    assert code == 2 and "--timing" in err
    code, _, err = pg("compare", *QUICK)
    assert "compare needs --against DIR|REF" in one_line_error(code, err)


def test_no_worktree_is_left_behind_on_a_bad_ref_a_failed_probe_or_ctrl_c(
    project: Path, pg: PG, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = pg("compare", *QUICK, "--against", "no-such-ref")
    assert "no such commit" in one_line_error(code, err)
    # The ref's tree has no perfguard and no --factory: the probe refuses it.
    code, _, err = pg("compare", *QUICK, "--against", "HEAD")
    assert "not importable as the base" in one_line_error(code, err)
    assert len(worktrees(project)) == 1

    made: list[Path] = []

    def interrupted(*args: object, **kwargs: object) -> None:
        made.append(Path(worktrees(project)[-1].split(" ", 1)[1]))
        raise KeyboardInterrupt

    monkeypatch.setattr(relative, "run_relative", interrupted)
    code, _, err = pg("compare", *QUICK, *FACTORY, "--against", "HEAD")
    assert code == 130 and "interrupted" in err  # Ctrl-C, through cli.main
    assert made and not made[0].exists()
    assert len(worktrees(project)) == 1


def test_temporary_worktree_is_removed_on_sigterm(project: Path) -> None:
    seen: list[Path] = []
    with pytest.raises(SystemExit) as exc, checkout.temporary_worktree("HEAD") as path:
        seen.append(path)
        assert (path / "pg_rel_pipes.py").is_file()
        os.kill(os.getpid(), 15)
    assert exc.value.code == 143 and not seen[0].exists() and len(worktrees(project)) == 1
