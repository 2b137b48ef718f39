"""Per-op time attribution: which operations a stage's change in time is made of.

Two sides of a case (base and head) are each profiled a few times
(`perfguard.measurement.profiling`): for every stage, every op (name and input shapes)
with its calls and its self time in each profiled run. This module compares the two
tables, with no torch: per stage, each op's median self time on each side, the change,
and its share of the stage's change, ranked by the change (the op that got slower
first). Self times add up to the stage's time exactly once, so the shares of a stage's
rows sum to one.

Which rows are *within noise* (the rule, in one paragraph): a row's change is real
only when it exceeds what the same op's self time already varies by between profiled
runs of one side, plus a floor. The noise of a row is the spread of its self time over
the base's runs plus that over the head's runs, so a difference of medians inside it is
one that repeated runs of an unchanged side produce. The spread is the range of the runs
left when the fastest and the slowest are set aside (`spread`; the whole range with
fewer than five runs): one run that a neighbour's load stretched would otherwise widen
the noise of every op it touched (an injected doubling of a stage's host time read as
noise at three runs a side with the whole range). To that is added what the row would
have moved had it only followed its side's pace (`side_paces`: the median head/base
ratio of the other rows both sides called alike): when one side's process ran slower throughout (a
neighbour's load), every op moves with it, and only the ops that moved beyond it are
what changed (an A/A explain on a loaded runner read its decoder's largest ops 2x
slower on one side without it). The floor, `NOISE_FLOOR_SHARE` of the stage's base
time (and at least `NOISE_FLOOR_US`), covers what the runs of one process share and
two processes do not (memory layout, a neighbour's load during one side): on unchanged
code (`perfguard explain --tag smoke --against HEAD`, docs/bisect.md) 1 of 2,535 rows
of the two smoke cases came out outside noise, on a 2-core runner at load ~4.5. A row
whose calls differ between the sides is never within noise: a call count is exact (the
op is dispatched more, or less), whatever its times' spread on a busy runner. A row
outside noise whose change is negative is an op that got faster.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfguard.metrics import DENOISING_STAGE, is_work_metric

ATTRIBUTION_VERSION = 1
"""The layout version of the report's attribution section (`Attribution.to_json`)."""
NOISE_FLOOR_SHARE = 0.02
"""Of a stage's base time: the smallest change of one op called real, 2 %. With it, 0 of
2,608 rows of the two smoke cases' unchanged code came out outside noise on a 2-core
runner at load ~1.6-2.2 (docs/bisect.md), 1 of 2,535 at load ~4.5 (commit 3630e19)."""
NOISE_FLOOR_US = 20.0
"""The floor's least value: below a few tens of microseconds the profiler's own per-op
cost (~1-2 us a call on CPU) and the timer's resolution dominate a row."""
KEPT_ROWS = 25
"""Rows kept per stage in a report, most changed first (the rest are counted)."""

Table = Mapping[str, Sequence[Mapping[str, Any]]]
"""One profiled run: stage -> rows of `name`, `shapes`, `calls`, `self_us`."""


@dataclass(frozen=True)
class OpRow:
    """One op (name and input shapes) of one stage on both sides; times in microseconds."""

    name: str
    shapes: str
    calls_base: int
    calls_head: int
    base_us: float
    head_us: float
    noise_us: float
    share: float | None
    """Of the stage's change (None when the stage barely changed)."""

    @property
    def delta_us(self) -> float:
        return self.head_us - self.base_us

    @property
    def within_noise(self) -> bool:
        """The change is within noise: the same calls on both sides and a change of self
        time no larger than its noise. A call count that differs is a change in what
        runs, exact whatever the timings' spread (the op is dispatched more or less)."""
        return self.calls_base == self.calls_head and abs(self.delta_us) <= self.noise_us

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shapes": self.shapes,
            "calls_base": self.calls_base,
            "calls_head": self.calls_head,
            "base_us": round(self.base_us, 3),
            "head_us": round(self.head_us, 3),
            "delta_us": round(self.delta_us, 3),
            "noise_us": round(self.noise_us, 3),
            "share": None if self.share is None else round(self.share, 4),
            "within_noise": self.within_noise,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OpRow:
        share = data.get("share")
        return cls(
            name=str(data["name"]),
            shapes=str(data.get("shapes", "")),
            calls_base=int(data["calls_base"]),
            calls_head=int(data["calls_head"]),
            base_us=float(data["base_us"]),
            head_us=float(data["head_us"]),
            noise_us=float(data["noise_us"]),
            share=None if share is None else float(share),
        )


@dataclass(frozen=True)
class StageAttribution:
    """A stage's ops ranked by their change in self time, the most slowed first."""

    stage: str
    base_us: float
    head_us: float
    noise_us: float
    rows: tuple[OpRow, ...]
    rows_total: int
    """Rows before `KEPT_ROWS` cut the list (the omitted ones are the least changed)."""

    @property
    def delta_us(self) -> float:
        return self.head_us - self.base_us

    @property
    def outside_noise(self) -> list[OpRow]:
        return [r for r in self.rows if not r.within_noise]

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "base_us": round(self.base_us, 3),
            "head_us": round(self.head_us, 3),
            "delta_us": round(self.delta_us, 3),
            "noise_us": round(self.noise_us, 3),
            "rows_total": self.rows_total,
            "rows": [r.to_json() for r in self.rows],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StageAttribution:
        return cls(
            stage=str(data["stage"]),
            base_us=float(data["base_us"]),
            head_us=float(data["head_us"]),
            noise_us=float(data["noise_us"]),
            rows=tuple(OpRow.from_json(r) for r in data.get("rows", ())),
            rows_total=int(data.get("rows_total", len(data.get("rows", ())))),
        )


@dataclass(frozen=True)
class CaseAttribution:
    """One case's attribution: the sides that were profiled and the stages compared.

    `sides` says per side (`base`, `head`) what ran: its label, commit, perfguard,
    the Chrome trace's path. `error` is why there is none (a side that cannot run, a
    stored baseline whose revision the repository lacks)."""

    case_id: str
    metrics: tuple[str, ...] = ()
    sides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    stages: tuple[StageAttribution, ...] = ()
    error: str | None = None

    def stage(self, name: str) -> StageAttribution | None:
        return next((s for s in self.stages if s.stage == name), None)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "metrics": list(self.metrics),
            "sides": {k: dict(v) for k, v in sorted(self.sides.items())},
            "stages": [s.to_json() for s in self.stages],
        }
        if self.error is not None:
            out["error"] = self.error
        return out

    @classmethod
    def from_json(cls, case_id: str, data: Mapping[str, Any]) -> CaseAttribution:
        return cls(
            case_id=case_id,
            metrics=tuple(data.get("metrics", ())),
            sides={k: dict(v) for k, v in data.get("sides", {}).items()},
            stages=tuple(StageAttribution.from_json(s) for s in data.get("stages", ())),
            error=data.get("error"),
        )


@dataclass(frozen=True)
class Attribution:
    """The report section: every attributed case, with the rule that says what is noise."""

    cases: tuple[CaseAttribution, ...]
    runs: int

    def case(self, case_id: str) -> CaseAttribution | None:
        return next((c for c in self.cases if c.case_id == case_id), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": ATTRIBUTION_VERSION,
            "unit": "us",
            "runs_per_side": self.runs,
            "noise": {"floor_share": NOISE_FLOOR_SHARE, "floor_us": NOISE_FLOOR_US},
            "cases": {c.case_id: c.to_json() for c in sorted(self.cases, key=lambda c: c.case_id)},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Attribution:
        cases = tuple(CaseAttribution.from_json(k, v) for k, v in data.get("cases", {}).items())
        return cls(cases=cases, runs=int(data.get("runs_per_side", 0)))


def _per_run(runs: Sequence[Table], stage: str) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(name, shapes) -> (calls, self time) in each run; an op absent from a run is
    (0, 0.0) in it, so every list is as long as `runs`."""
    out: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for i, run in enumerate(runs):
        for row in run.get(stage, ()):
            key = (str(row["name"]), str(row.get("shapes", "")))
            values = out.setdefault(key, [(0, 0.0)] * len(runs))
            calls, us = values[i]
            values[i] = (calls + int(row["calls"]), us + float(row["self_us"]))
    for values in out.values():
        values.extend([(0, 0.0)] * (len(runs) - len(values)))
    return out


def _side(values: Sequence[tuple[int, float]] | None, n: int) -> tuple[int, float, float]:
    """Median calls, median self time and spread of self time over a side's runs."""
    if not values:
        return 0, 0.0, 0.0
    times = [us for _, us in values]
    calls = sorted(c for c, _ in values)[len(values) // 2]
    return calls, statistics.median(times), spread(times)


def spread(values: Sequence[float]) -> float:
    """The range of `values` without their lowest and highest (with five or more)."""
    ordered = sorted(values)
    if len(ordered) >= 5:
        ordered = ordered[1:-1]
    return ordered[-1] - ordered[0] if ordered else 0.0


def _totals(runs: Sequence[Table], stage: str) -> list[float]:
    return [sum(float(r["self_us"]) for r in run.get(stage, ())) for run in runs]


def compare_stage(
    stage: str, base: Sequence[Table], head: Sequence[Table], *, keep: int = KEPT_ROWS
) -> StageAttribution:
    """`stage`'s rows of both sides, ranked by their change (most slowed first)."""
    b_ops, h_ops = _per_run(base, stage), _per_run(head, stage)
    b_tot, h_tot = _totals(base, stage), _totals(head, stage)
    base_us = statistics.median(b_tot) if b_tot else 0.0
    head_us = statistics.median(h_tot) if h_tot else 0.0
    floor = max(NOISE_FLOOR_US, NOISE_FLOOR_SHARE * base_us)
    stage_noise = spread(b_tot) + spread(h_tot)
    sides = {}
    for key in set(b_ops) | set(h_ops):
        sides[key] = (_side(b_ops.get(key), len(base)), _side(h_ops.get(key), len(head)))
    paces = side_paces(sides)
    rows: list[OpRow] = []
    for key, ((cb, mb, rb), (ch, mh, rh)) in sides.items():
        noise = rb + rh + floor + abs(paces[key] - 1.0) * mb
        rows.append(OpRow(key[0], key[1], cb, ch, mb, mh, noise, None))
    total_delta = sum(r.delta_us for r in rows)
    if abs(total_delta) > floor:
        rows = [_with_share(r, total_delta) for r in rows]
    rows.sort(key=lambda r: (-r.delta_us, r.name, r.shapes))
    kept = _kept(rows, keep)
    return StageAttribution(
        stage=stage,
        base_us=base_us,
        head_us=head_us,
        noise_us=stage_noise + floor,
        rows=tuple(kept),
        rows_total=len(rows),
    )


def side_paces(
    sides: Mapping[tuple[str, str], tuple[tuple[int, float, float], tuple[int, float, float]]],
) -> dict[tuple[str, str], float]:
    """How much slower the head ran than the base, op for op, as each row's peers saw it:
    the median head/base ratio of the other rows both sides called alike (at least
    `NOISE_FLOOR_US` on the base); 1.0 without any. A neighbour's load, or another
    process's memory layout, slows every op of one side alike; a row that moved no more
    than its peers moved with its side. The row's own ratio is left out, so a stage of a
    few ops cannot call its one slower op the pace."""
    ratios = {
        key: h[1] / b[1]
        for key, (b, h) in sides.items()
        if b[0] == h[0] and b[0] > 0 and b[1] >= NOISE_FLOOR_US
    }
    ordered = sorted(ratios.values())
    whole = statistics.median(ordered) if ordered else 1.0
    out = {}
    for key in sides:
        if key not in ratios:
            out[key] = whole
            continue
        others = list(ordered)
        others.remove(ratios[key])
        out[key] = statistics.median(others) if others else 1.0
    return out


def _with_share(row: OpRow, total: float) -> OpRow:
    return OpRow(
        row.name, row.shapes, row.calls_base, row.calls_head, row.base_us, row.head_us,
        row.noise_us, row.delta_us / total,
    )  # fmt: skip


def _kept(rows: Sequence[OpRow], keep: int) -> list[OpRow]:
    """The `keep` rows that changed most either way, in ranked order."""
    if len(rows) <= keep:
        return list(rows)
    chosen = set(sorted(range(len(rows)), key=lambda i: -abs(rows[i].delta_us))[:keep])
    return [r for i, r in enumerate(rows) if i in chosen]


def attribute(
    case_id: str,
    base_runs: Sequence[Table],
    head_runs: Sequence[Table],
    *,
    stages: Sequence[str] | None = None,
    metrics: Sequence[str] = (),
    sides: Mapping[str, Mapping[str, Any]] | None = None,
) -> CaseAttribution:
    """Compare two sides' profiled runs of `case_id`: the `stages` asked for (None:
    every stage either side ran), the most changed stage first."""
    if not base_runs or not head_runs:
        raise ValueError("each side needs at least one profiled run")
    names = (
        list(stages)
        if stages is not None
        else sorted({s for run in [*base_runs, *head_runs] for s in run})
    )
    compared = [compare_stage(s, base_runs, head_runs) for s in names]
    if stages is None:
        compared.sort(key=lambda s: -s.delta_us)
    return CaseAttribution(
        case_id=case_id, metrics=tuple(metrics), sides=dict(sides or {}), stages=tuple(compared)
    )


def timed(metric: str) -> bool:
    """Whether `metric` is a time that an attribution explains (not work, not memory)."""
    return not is_work_metric(metric) and not metric.startswith("peak_memory")


def stages_of(metrics: Sequence[str]) -> list[str] | None:
    """The stages whose ops explain `metrics`: `stage:X` names X; a step metric names
    the denoising stage; `e2e` (or nothing) names every stage (None)."""
    out: list[str] = []
    for m in metrics:
        if m.startswith("stage:"):
            name = m[len("stage:") :]
        elif m.startswith("step"):
            name = DENOISING_STAGE
        else:
            return None
        if name not in out:
            out.append(name)
    return out or None
