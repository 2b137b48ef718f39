"""How a check judges: one frozen value (`JudgeOptions`), built once by the command and
passed whole to the gate and the verdict, as `MeasureOptions` is to the measuring."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from perfguard.decision.comparison import DEFAULT_RULE, RELATIVE_RULE, Rule
from perfguard.decision.contention import DEFAULT_POLICY, ContentionPolicy
from perfguard.decision.resolution import DEFAULT_TIMING_GATE, TIMING_GATES
from perfguard.decision.tolerances import DEFAULT_PROFILE

DEFAULT_MAX_RERUNS = 8
"""Fresh confirmation processes for a case over its bound: with the first measurement,
up to nine processes, 8 degrees of freedom of the check's own beside the baseline's 9
(10 processes). A confirmation is a fork of the warm server that builds and times one
case without recounting its work (~0.4 s for a smoke case), and it only runs while a
metric is over its bound, so unchanged code rarely pays for one (the median A/A check
took 1.5 s). At the stored level of 0.1 % the interval needs them: replayed on the same
kept checks (`benchmarks/rejudge.py`, docs/verdicts.md), capping them at 4 instead of 8
caught +10 % in 31 of 36 checks instead of 32 and failed 4 of 143 A/A checks instead
of 2. Earlier, at 1 %, 4 against 2: +5 % caught in 12 of 16 checks instead of 6."""

DEFAULT_CONFIRM_GAP_S = 0.0
"""Seconds between the end of one measurement of a case and the confirmation that
follows it. The runner's speed moves in spells of a few runs to a minute
(docs/verdicts.md), longer than a smoke case's process (~0.5 s), so confirmations
started back to back share the first measurement's spell; a gap lets them meet other
moments. Measured interleaved against the same baselines on a noisy day
(`benchmarks/detection.py --check-variants`, docs/verdicts.md), a 5 s gap cut the A/A
false alarms from 3 of 75 checks to 1 of 75 but the +10 % catches from 5 of 19 to 2 of
19, and +5 % from 4 of 19 to 0: the spread between moments widens the interval for a
real slowdown as much as for noise. So no gap by default; `--confirm-gap-s` is there for
a runner whose false alarms come from spells."""


@dataclass(frozen=True)
class JudgeOptions:
    """How a check judges: one frozen value, built once by the CLI and passed down.

    - `profile`: the baseline's tolerance profile (`pr_test`, `long_term`).
    - `fail_on_missing`: missing baselines, missing and new stages fail the check.
    - `advisory`: regressions are reported, never failed.
    - `allow_output_change`: a changed output is reported, not failed.
    - `max_reruns`: fresh confirmation processes for a case over its bound.
    - `confirm_gap_s`: seconds to wait before each confirmation (0: none).
    - `rule`, `policy`: the evidence a verdict needs and the contention screen.
    - `timing_gate`: which timed figures get all three answers on this runner
      (`perfguard.decision.resolution`: auto, gate or advise).

    A relative check (`perfguard.measurement.relative`) uses `fail_on_missing`,
    `advisory`, `allow_output_change` and the rule's alpha (`RELATIVE_RULE` unless
    the caller chose one); it has no profile and no confirmations.
    """

    profile: str = DEFAULT_PROFILE
    fail_on_missing: bool = False
    advisory: bool = False
    allow_output_change: bool = False
    max_reruns: int = DEFAULT_MAX_RERUNS
    rule: Rule = DEFAULT_RULE
    policy: ContentionPolicy = DEFAULT_POLICY
    confirm_gap_s: float = DEFAULT_CONFIRM_GAP_S
    timing_gate: str = DEFAULT_TIMING_GATE

    def __post_init__(self) -> None:
        if self.timing_gate not in TIMING_GATES:
            raise ValueError(
                f"timing gate must be one of {', '.join(TIMING_GATES)}, not {self.timing_gate!r}"
            )
        if self.max_reruns < 0:
            raise ValueError("max_reruns must be >= 0")
        if not self.confirm_gap_s >= 0:
            raise ValueError(f"confirm_gap_s must be >= 0 seconds, not {self.confirm_gap_s}")

    def replace(self, **changes: Any) -> JudgeOptions:
        return dataclasses.replace(self, **changes)


RELATIVE_JUDGING = JudgeOptions(rule=RELATIVE_RULE)
"""How a relative check judges unless told otherwise: at the relative level (1 %)."""
