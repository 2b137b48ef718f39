"""How a check judges: one frozen value (`JudgeOptions`), built once by the command and
passed whole to the gate and the verdict, as `MeasureOptions` is to the measuring, and
resolved once against the baseline (`Judging`: the options with the profile they name)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perfguard.decision.comparison import DEFAULT_RULE, RELATIVE_RULE, Rule
from perfguard.decision.contention import DEFAULT_POLICY, ContentionPolicy
from perfguard.decision.resolution import DEFAULT_TIMING_GATE, TIMING_GATES
from perfguard.decision.tolerances import (
    DEFAULT_IMPROVEMENT_THRESHOLD,
    DEFAULT_PROFILE,
    Profile,
)

if TYPE_CHECKING:  # pragma: no cover
    from perfguard.storage.baseline import Baseline

DEFAULT_MAX_RERUNS = 8
"""Fresh confirmation processes for a case over its bound or that can't tell: 8, so a check
has up to nine processes beside the baseline's ten. At the stored level the interval
needs them: replayed on the kept checks (`benchmarks/rejudge.py`), a cap of 4 caught
+10 % in 31 of 36 instead of 32 and failed 4 of 143 A/A checks instead of 2
(docs/measurements/2026-12-07-constants.md)."""

DEFAULT_CONFIRM_GAP_S = 0.0
"""Seconds between a measurement and the confirmation after it: 0. Interleaved on a noisy
day (`benchmarks/detection.py --check-variants`), a 5 s gap cut A/A false alarms from 3
of 75 to 1 of 75 but +10 % catches from 5 of 19 to 2 of 19; `--confirm-gap-s` is there
for a runner whose false alarms come from spells (docs/measurements/2026-12-07-constants.md)."""


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

    def against(self, baseline: Baseline) -> Judging:
        """These options resolved against `baseline`: its profile of that name, its
        improvement threshold and the steps it gates."""
        profile = baseline.profile(self.profile)
        return Judging(self, profile, baseline.improvement_threshold, baseline.step_fractions)


@dataclass(frozen=True)
class Judging:
    """A check's options (passed whole) with what they resolve to on one baseline, looked
    up once per check: the tolerance `profile` they name, the baseline's
    `improvement_threshold` and the `step_fractions` of the steps it gates."""

    options: JudgeOptions
    profile: Profile
    improvement_threshold: float = DEFAULT_IMPROVEMENT_THRESHOLD
    step_fractions: Sequence[float] | None = None


RELATIVE_JUDGING = JudgeOptions(rule=RELATIVE_RULE)
"""How a relative check judges unless told otherwise: at the relative level (1 %)."""
