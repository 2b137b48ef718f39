"""The relative check (`perfguard compare --against DIR|REF`): head and base measured side by side.

A stored baseline compares two moments, often on two machines; on shared or pooled
runners that difference alone can exceed the slowdown a PR introduces. The relative
check measures the base revision and the head on the same runner, at the same time,
and judges the head against that base, as asv's `continuous` and Bencher's relative
benchmarking do.

How it measures (each choice with its reason):

- Blocks of fresh processes. A block starts one worker process of each side, runs every
  selected case once in each (warm-up plus `--repeats` runs), and retires both. Fresh
  processes because the process is the unit of drift on a shared machine (memory
  layout, frequency, neighbours: several percent between processes, more than the runs
  of one process spread), so a verdict must average over processes, never over the runs
  of one.
- Randomized, interleaved order (RMIT, Laaber et al. EMSE'19). Blocks come in mirrored
  pairs, base-head then head-base or the reverse, the first of each pair drawn at
  random: the mirror cancels a trend within the pair (ABBA), the draw keeps the order
  from lining up with periodic load. Inside a block the two sides alternate case by case
  (base, head, head, base, ...), so a case's two measurements are seconds apart; both
  workers are started together and wait idle while the other side runs. Only the first
  `COUNTED_PROCESSES` blocks count the work (one untimed counted run per case and
  side): the counts are exact, and the time buys blocks.
- Paired per-block log ratios (`perfguard.decision.estimate.paired_estimate`): the drift
  that the two sides of a block share cancels in their ratio.
- Adaptive, Pinpoint-style. After the minimum number of blocks the verdicts are looked
  at on a fixed schedule of block counts. A metric found clearly different or clearly
  the same at a look keeps that verdict (a sequential test stops where it decides: the
  blocks that follow cannot undo it, as a later contention episode otherwise would);
  the check stops as soon as every metric is decided, when `--max-blocks` is reached,
  or when the next block pair would overrun `--budget-s`. Metrics still open then read
  can't tell (exit 4), or below resolution where the blocks could not have resolved them.
- Repeated looks cost false alarms, so the schedule is fixed and every look tests at one
  level (`perfguard.decision.looks.alpha_per_look`): the largest at which noise alone
  fails a metric at some scheduled look with probability `alpha` less that level (paid
  for the look a budget stop may add between two scheduled ones), found by simulating
  A/A checks through the same statistic (Pocock's boundary). However the check stops,
  the chance that noise alone fails a metric stays at most `alpha`.

Where the code comes from: the base side's workers import the base revision's code and
the head side's the caller's (`perfguard.measurement.paired_blocks`); the cases come
from the caller's registry on both sides (as asv takes its benchmarks from the current
checkout), and a probe of the base says first whether it can run them
(`perfguard.measurement.base_revision`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from perfguard.decision.looks import look_points
from perfguard.decision.options import JudgeOptions
from perfguard.decision.paired import (
    BASE,
    HEAD,
    SIDES,
    Block,
    BlockComparison,
    LookLevels,
    RelativeOutcome,
    judge_blocks,
)
from perfguard.decision.records import ERROR, MetricVerdict
from perfguard.errors import PerfguardError
from perfguard.metrics import timing_of
from perfguard.results import CaseResult
from perfguard.storage.cases import Case

DEFAULT_BUDGET_S = 50.0
"""Measurement time a relative check may spend. With workers forked from warm servers a
block of the two smoke cases costs its builds and runs (a few seconds on the 2-core
runner) instead of two interpreters' imports (12-18 s a block when every worker was
spawned, when this was 150 s for 8-12 blocks): 50 s buys more blocks than 150 s did,
and the smoke check ends inside a minute, start-up included. Clear verdicts stop it
sooner."""

DEFAULT_MIN_BLOCKS = 4
"""Two mirrored pairs: the fewest blocks with which the between-block spread (3 degrees
of freedom) is worth a t-interval and a linear trend cancels twice."""

DEFAULT_MAX_BLOCKS = 24
"""The last scheduled look. Past it the interval narrows slowly (1 / sqrt(n)) while
every block costs two process starts."""


@dataclass(frozen=True)
class RelativeOptions:
    """What to compare with and how long to measure: `compare --against` and its knobs.

    `directory` (a checkout of the base revision) or `ref` (a revision of this
    repository, checked out in a temporary worktree); `subdir` is the base's import
    root inside it (sglang: `python`). Blocks are measured until every verdict is clear,
    `max_blocks`, or `budget_s`; `order_seed` fixes the randomized block order.
    `write_baseline` also stores the base side's measurement as a baseline file.
    `timing` compares each block's sides `raw` or `normalized` (each run divided by the
    reference time beside it); None: the platform's default (normalized on CPU).
    """

    directory: str | None = None
    ref: str | None = None
    subdir: str | None = None
    budget_s: float = DEFAULT_BUDGET_S
    min_blocks: int = DEFAULT_MIN_BLOCKS
    max_blocks: int = DEFAULT_MAX_BLOCKS
    order_seed: int | None = None
    write_baseline: str | None = None
    timing: str | None = None

    def __post_init__(self) -> None:
        if self.directory is not None and self.ref is not None:
            raise PerfguardError("use either a directory or a revision as --against, not both")
        if self.directory is None and self.ref is None:
            raise PerfguardError("a relative check needs --against DIR|REF")
        if self.max_blocks < self.min_blocks:
            raise PerfguardError("--max-blocks must be at least --min-blocks")

    def timing_on(self, platform: str) -> str:
        """`timing`, or the default of `platform` (normalized on CPU, raw on devices)."""
        return timing_of({"platform": platform}, self.timing)

    @property
    def schedule(self) -> Schedule:
        """The blocks these options allow (`run_relative`)."""
        return Schedule(self.min_blocks, self.max_blocks, self.budget_s, self.order_seed)


@dataclass(frozen=True)
class Schedule:
    """How many blocks a relative check measures: at least `min_blocks`, at most
    `max_blocks`, and no block pair that would overrun `budget_s`; `seed` fixes the
    randomized block order (None: drawn). `RelativeOptions.schedule` builds it from the
    command's flags; bisect builds its own per commit."""

    min_blocks: int = DEFAULT_MIN_BLOCKS
    max_blocks: int = DEFAULT_MAX_BLOCKS
    budget_s: float = DEFAULT_BUDGET_S
    seed: int | None = None


# ---- the schedule ---------------------------------------------------------------------------


def block_order(index: int, previous: str | None, rng: random.Random) -> str:
    """`BH` or `HB`: drawn for the first block of each pair, mirrored for the second."""
    if index % 2 == 1 and previous is not None:
        return previous[::-1]
    return rng.choice((BASE + HEAD, HEAD + BASE))


# ---- the check ------------------------------------------------------------------------------

MeasureBlock = Callable[[int, str, Sequence[Case]], Mapping[str, Mapping[str, CaseResult]]]
"""`measure(index, order, cases)`: one block, each side's processes started in `order`;
for each side (`BASE`, `HEAD`) a result per case."""

OnBlock = Callable[[int, Block, int], None]
"""`on_block(index, block, open_metrics)`: told after each block (open_metrics is -1
where the block was not a look)."""


def run_relative(
    cases: Sequence[Case],
    measure: MeasureBlock,
    schedule: Schedule = Schedule(),
    *,
    judging: JudgeOptions | None = None,
    comparison: BlockComparison | None = None,
    on_block: OnBlock | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> RelativeOutcome:
    """Measure blocks until every verdict is clear, `max_blocks`, or the budget; judge.

    `on_block` is told after each block. A case that fails on either side in a block is
    reported as that case's error and not measured again; the others go on. Of
    `judging`, `fail_on_missing`, `advisory`, `allow_output_change` and the rule's alpha
    apply; `comparison` says how each block's sides compare (raw by default, on CPU's floor).
    """
    judging = judging or JudgeOptions()
    alpha = judging.rule.alpha
    looks = look_points(schedule.min_blocks, schedule.max_blocks)
    levels = LookLevels(alpha, looks, comparison or BlockComparison())
    seed = schedule.seed
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    run = _Blocks(cases, levels)
    stopped = run.measure(measure, schedule, random.Random(seed), clock, on_block)
    if run.blocks and len(run.blocks) not in run.looked_at:
        run.looked_at.append(len(run.blocks))
    judgement, pooled = judge_blocks(
        [c.id for c in cases],
        run.blocks,
        final=True,
        errors=run.errors,
        latched=run.latched,
        judging=judging,
        levels=levels,
    )
    return RelativeOutcome(
        judgement=judgement,
        blocks=run.blocks,
        pooled=pooled,
        stopped=stopped,
        looks=looks,
        alpha=alpha,
        alpha_look=levels.alpha_look,
        seed=seed,
        elapsed_s=clock() - run.started,
        looked_at=run.looked_at,
    )


class _Blocks:
    """The blocks of a relative check so far: the cases still measured, each failed
    case's error, and the verdicts latched at a look (a sequential test stops where it
    decides)."""

    def __init__(self, cases: Sequence[Case], levels: LookLevels) -> None:
        self.ids = [c.id for c in cases]
        self.levels = levels
        self.active = list(cases)
        self.errors: dict[str, str] = {}
        self.latched: dict[tuple[str, str], MetricVerdict] = {}
        self.blocks: list[Block] = []
        self.looked_at: list[int] = []
        self.started = 0.0

    def measure(
        self,
        measure: MeasureBlock,
        schedule: Schedule,
        rng: random.Random,
        clock: Callable[[], float],
        on_block: OnBlock | None,
    ) -> str:
        """Measure blocks, looking at the scheduled block counts, until the check stops;
        why it stopped (`resolved`, `budget`, `max-blocks`, `every case failed`)."""
        self.started = started = clock()
        previous: str | None = None
        while len(self.blocks) < schedule.max_blocks:
            n = len(self.blocks)
            if n >= schedule.min_blocks and n % 2 == 0:
                pair_s = 2 * sum(b.seconds for b in self.blocks) / n
                if clock() - started + pair_s > schedule.budget_s:
                    return "budget"
            if not self.active:
                return "every case failed"
            order = block_order(n, previous, rng)
            previous = order
            t0 = clock()
            measured = measure(n, order, self.active)
            block = Block(order, clock() - t0, {s: dict(measured.get(s, {})) for s in (BASE, HEAD)})
            self.add(block)
            open_metrics = self.look() if len(self.blocks) in self.levels.looks else -1
            if on_block is not None:
                on_block(n, block, open_metrics)
            if open_metrics == 0:
                return "resolved"
        return "max-blocks"

    def add(self, block: Block) -> None:
        """Keep `block`; a case without a good result on either side leaves the check."""
        self.blocks.append(block)
        for case in list(self.active):
            for side in block.order:
                res = block.results[side].get(case.id)
                if res is None or res.status != "ok":
                    why = "no result" if res is None else (res.error or "failed")
                    self.errors.setdefault(case.id, f"{SIDES[side]}: {why}")
            if case.id in self.errors:
                self.active.remove(case)

    def look(self) -> int:
        """Judge the blocks so far, latch the clear verdicts; how many metrics are open."""
        self.looked_at.append(len(self.blocks))
        judgement, _ = judge_blocks(
            self.ids,
            self.blocks,
            final=False,
            errors=self.errors,
            latched=self.latched,
            levels=self.levels,
        )
        open_metrics = 0
        for c in judgement.cases:
            if c.verdict == ERROR:
                continue
            for m in c.metrics:
                if m.clear:
                    self.latched.setdefault((c.case_id, m.metric), m)
                else:
                    open_metrics += 1
        return open_metrics
