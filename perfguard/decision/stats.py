"""Sample statistics: the one place for summaries, noise estimates and quantiles.

The verdict (`perfguard.decision.verdict`), A/B comparisons (`perfguard.measurement.ab`),
calibration (`perfguard.decision.calibrate`) and baselines (`perfguard.storage.baseline`)
all take their statistics from here, so that "how noisy is this figure" has one answer.
This module decides nothing: `perfguard.decision.verdict` turns these figures into verdicts.

Why medians: timings on a shared machine are right-skewed (a preempted run is slower,
never faster), so the mean chases outliers while the median stays put. There are two
engines, and only two: this module's analytic noise model for the stored check
(unpaired: a check against a committed baseline), and the paired per-block estimate of
`perfguard.decision.estimate` for the relative check and `perfguard ab`; the bounds both put
on a ratio are `perfguard.decision.answer.bound`'s.

Why a separate, analytic noise model for the gate (`log_ratio_noise`): the gate judges
after every run while it samples adaptively, where a bootstrap would cost more than the
runs it saves; and, more importantly, neither a bootstrap nor a rank test of one
process's samples against another's knows that the process itself is a source of
variation. On a shared CPU runner medians move by several percent between processes
(memory layout, frequency, neighbours) while the samples inside one process are tight;
a test that only sees the samples calls that drift "significant". The noise model
therefore adds the between-process spread of per-process medians whenever the data has
more than one process (`Summary.processes`), as pyperf treats the process as its unit.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def _scipy_stats() -> Any:
    """`scipy.stats`, imported on first use: it costs ~0.5 s, which the commands that
    only read or render files (`report render`, `baselines show`, `history`) never need."""
    from scipy import stats

    return stats


MAD_TO_SD = 1.4826
"""MAD x 1.4826 estimates the standard deviation of normal data, ignoring outliers."""

MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)
"""The median of n normal samples has a standard error of sqrt(pi/2) * sd / sqrt(n)
(asymptotically; for n = 5 the true factor is ~1.20, so this errs on the wide side)."""

MIN_SPREAD_SAMPLES = 3
"""Below three samples a MAD says nothing about the noise; the other side's spread is used."""


# ---- summaries -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """The median of some samples with their spread; what baselines and reports store.

    `iqr` (interquartile range) and `mad` (median absolute deviation) are the spread
    measures that a few outliers do not move; `min` / `max` show the outliers themselves.
    `samples` is kept when known: rank tests and the noise model need the raw values.
    `processes` holds the median of each process (or pipeline build) the samples came
    from, when there were two or more: their spread is the between-process noise that
    the samples of any single process cannot show.
    """

    median: float
    n: int
    min: float | None = None
    max: float | None = None
    iqr: float | None = None
    mad: float | None = None
    samples: tuple[float, ...] | None = None
    processes: tuple[float, ...] | None = None

    @property
    def rel_iqr(self) -> float | None:
        """IQR as a fraction of the median: the noise figure quoted throughout perfguard."""
        if self.iqr is None:
            return None
        return self.iqr / self.median if self.median else 0.0

    def to_json(self, digits: int = 3) -> dict[str, Any]:
        out: dict[str, Any] = {"median": round(self.median, digits), "n": self.n}
        for key in ("min", "max", "iqr", "mad"):
            value = getattr(self, key)
            if value is not None:
                out[key] = round(value, digits)
        if self.samples is not None:
            out["samples"] = [round(x, digits) for x in self.samples]
        if self.processes is not None:
            out["processes"] = [round(x, digits) for x in self.processes]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Summary:
        def opt(key: str) -> float | None:
            return None if data.get(key) is None else float(data[key])

        def many(key: str) -> tuple[float, ...] | None:
            values = data.get(key)
            return None if values is None else tuple(float(x) for x in values)

        return cls(
            median=float(data["median"]),
            n=int(data["n"]),
            min=opt("min"),
            max=opt("max"),
            iqr=opt("iqr"),
            mad=opt("mad"),
            samples=many("samples"),
            processes=many("processes"),
        )

    def rounded(self, digits: int = 3) -> Summary:
        """The summary as it reads back from a file (figures rounded to `digits`)."""
        return Summary.from_json(self.to_json(digits))


def split_groups(samples: Sequence[float], groups: Sequence[int] | None) -> list[list[float]]:
    """`samples` cut into consecutive groups of the sizes in `groups` (one group if None).

    `ValueError` when the sizes do not add up to the number of samples, so a results
    file whose groups and samples disagree is caught rather than silently misread.
    """
    xs = [float(x) for x in samples]
    if not groups:
        return [xs]
    if sum(groups) != len(xs) or any(g < 1 for g in groups):
        raise ValueError(f"groups {list(groups)} do not partition {len(xs)} samples")
    out, at = [], 0
    for size in groups:
        out.append(xs[at : at + size])
        at += size
    return out


def summarize(
    samples: Sequence[float], keep_samples: bool = True, groups: Sequence[int] | None = None
) -> Summary:
    """Median, spread, (optionally) the samples, and per-group medians for 2+ groups.

    `groups` gives the number of consecutive samples from each process (see
    `perfguard.results.CaseResult.groups`); a metric that some runs did not produce
    cannot be split by them and gets no per-process medians (its verdict then rests on
    the samples' spread alone). `ValueError` when there are no samples.
    """
    if not samples:
        raise ValueError("no samples to summarize")
    xs = [float(x) for x in samples]
    med = statistics.median(xs)
    if len(xs) >= 2:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
        iqr = q3 - q1
    else:
        iqr = 0.0
    mad = statistics.median(abs(x - med) for x in xs)
    try:
        parts = split_groups(xs, groups)
    except ValueError:
        parts = [xs]
    processes = tuple(statistics.median(p) for p in parts) if len(parts) >= 2 else None
    return Summary(
        median=med,
        n=len(xs),
        min=min(xs),
        max=max(xs),
        iqr=iqr,
        mad=mad,
        samples=tuple(xs) if keep_samples else None,
        processes=processes,
    )


# ---- the gate's noise model ----------------------------------------------------------------


def log_spread(summary: Summary) -> float | None:
    """Robust per-sample noise on a log scale (~ relative sd), or None when unknown.

    From the samples when there are at least `MIN_SPREAD_SAMPLES`: 1.4826 x the MAD of
    the log samples (log, because timing noise is multiplicative: a stage twice as long
    jitters twice as much). Else from a stored IQR (IQR / 1.349 is the sd of normal
    data), which is all an imported baseline may have. None with fewer than three
    samples and no IQR: one sample says nothing about the noise.
    """
    if summary.median <= 0 or summary.n < MIN_SPREAD_SAMPLES:
        return None
    if summary.samples is not None and all(x > 0 for x in summary.samples):
        # Plain Python: for tens of samples it is several times faster than numpy's
        # median, and the gate evaluates this after every run.
        logs = [math.log(x) for x in summary.samples]
        centre = statistics.median(logs)
        return MAD_TO_SD * statistics.median(abs(v - centre) for v in logs)
    if summary.iqr is not None:
        return summary.iqr / 1.349 / summary.median
    return None


def process_spread(*summaries: Summary) -> tuple[float, int] | None:
    """The sd of log per-process medians, pooled over `summaries`, and its degrees of freedom.

    Each summary's process medians are taken about their own centre (a baseline and a
    slowed-down check differ by the slowdown, not by noise), and the variances pooled
    by degrees of freedom. None when no summary has two or more processes.

    The per-process median already carries the within-process noise of its samples, so
    this is the whole noise of "one more process's median", as a check measures it.
    """
    ss, dof = 0.0, 0
    for s in summaries:
        if s.processes is None or len(s.processes) < 2 or min(s.processes) <= 0:
            continue
        logs = [math.log(x) for x in s.processes]
        centre = sum(logs) / len(logs)
        ss += sum((v - centre) ** 2 for v in logs)
        dof += len(logs) - 1
    if dof == 0:
        return None
    return math.sqrt(ss / dof), dof


@dataclass(frozen=True)
class Noise:
    """The standard error of log(current median / baseline median), and where it came from.

    `within` is what the samples alone show (each median's standard error from its
    spread); `between` is what the per-process medians show (zero when neither side has
    two processes); `se` is the larger of the two, since the process medians already
    contain the within-process noise, widened by `session_sd`: the sd of the offset one
    session of the runner leaves on a figure that no process of it shows (a stored
    baseline is one session, a check another, so it enters twice: se^2 + 2 session_sd^2;
    `Profile.session_sd`). `source` says which one the verdict used, and
    `dof` how many degrees of freedom estimated it: an interval must use Student's t
    with them, not the normal quantile (with 3 processes, dof 2, the one-sided 99 %
    quantile is 6.96, not 2.33).
    """

    se: float
    within: float
    between: float
    processes_baseline: int
    processes_current: int
    between_dof: int = 0
    within_dof: int = 0
    session_sd: float = 0.0

    @property
    def dof(self) -> int:
        """Degrees of freedom of the noise estimate (0: unknown): the between-process
        spread's whenever one was measured, even when the samples' spread is the larger;
        with a session term, the Welch-Satterthwaite degrees of freedom of the sum (the
        term is a constant of the profile, known, not estimated: it does not pay for the
        few processes of the estimated part).

        A median of several processes varies by the spread of process medians; the
        samples' spread is only a floor under it (`se` is the larger of the two). When
        a few process medians happen to agree, that floor is what `se` shows, but it
        is still known only as well as those few processes show it: Student's t at the
        samples' dof (~30) instead of the processes' (2-4) made one process over its
        bound, against a baseline whose three processes agreed, a credible regression
        of unchanged code (the detection runs in docs/verdicts.md).
        """
        estimated = self.between_dof if self.between_dof > 0 else self.within_dof
        return satterthwaite(self.se, math.sqrt(2.0) * self.session_sd, estimated)

    @property
    def source(self) -> str:
        if self.between > 0 and self.between >= self.within:
            where = f"between-process spread ({self.between_dof} dof)"
        elif self.within > 0 and self.between_dof > 0:
            where = f"within-process spread, at the processes' {self.between_dof} dof"
        elif self.within > 0:
            where = "within-process spread"
        else:
            where = "no spread known"
        if self.session_sd > 0:
            where += f" and a session offset of {self.session_sd:.1%} on each side"
        return where

    def to_json(self) -> dict[str, Any]:
        return {
            "se": round(self.se, 5),
            "within": round(self.within, 5),
            "between": round(self.between, 5),
            "processes_baseline": self.processes_baseline,
            "processes_current": self.processes_current,
            "dof": self.dof,
            "within_dof": self.within_dof,
            "between_dof": self.between_dof,
            "session": round(self.session_sd, 5),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Noise:
        """The inverse of `to_json`; a report written before the two degrees of freedom
        were kept apart gives its one `dof` to both (the one the verdict used)."""
        dof = int(data.get("dof", 0))
        return cls(
            se=float(data["se"]),
            within=float(data["within"]),
            between=float(data["between"]),
            processes_baseline=int(data["processes_baseline"]),
            processes_current=int(data["processes_current"]),
            between_dof=int(data.get("between_dof", dof)),
            within_dof=int(data.get("within_dof", dof)),
            session_sd=float(data.get("session", 0.0)),
        )


def log_ratio_noise(baseline: Summary, current: Summary, session_sd: float = 0.0) -> Noise:
    """How uncertain log(current.median / baseline.median) is, from both sides' data.

    Within processes: each median's standard error is sqrt(pi/2) x its per-sample noise
    / sqrt(n); a side whose noise is unknown (one sample, an imported figure) borrows
    the other side's, and with neither the within part is 0 (no evidence: the band
    alone decides). Between processes: with s the pooled sd of per-process medians,
    each side's median varies by s^2 / (its number of processes); a side measured in one
    process counts as one. When no side has two processes this part is 0, and the bands
    must cover the drift between processes (`perfguard calibrate` measures it).
    `session_sd` (an sd on the log scale) is the offset of one session of the runner that
    neither side's processes show: it is added once for each side.
    """
    wb, wc = log_spread(baseline), log_spread(current)
    wb = wc if wb is None else wb
    wc = wb if wc is None else wc
    within, within_dof = 0.0, 0
    if wb is not None and wc is not None:
        within = MEDIAN_SE_FACTOR * math.sqrt(wb**2 / baseline.n + wc**2 / current.n)
        known = [s.n for s in (baseline, current) if log_spread(s) is not None]
        within_dof = max(1, sum(known) - len(known))
    kb = len(baseline.processes) if baseline.processes else 1
    kc = len(current.processes) if current.processes else 1
    spread = process_spread(baseline, current)
    between, dof = 0.0, 0
    if spread is not None:
        s, dof = spread
        between = s * math.sqrt(1.0 / kb + 1.0 / kc)
    se = math.sqrt(max(within, between) ** 2 + 2.0 * session_sd**2)
    return Noise(se, within, between, kb, kc, dof, within_dof, session_sd)


@functools.lru_cache(maxsize=256)
def satterthwaite(se: float, known: float, dof: int) -> int:
    """Welch-Satterthwaite: the degrees of freedom of se^2 = estimated + known^2, the
    estimated part on `dof` (0: unknown, the normal quantile)."""
    estimated = se * se - known * known
    if known <= 0 or dof <= 0:
        return dof
    if estimated <= 0:
        return 0  # all of it known: the normal quantile
    return min(int(dof * (se * se / estimated) ** 2), 10_001)


def t_quantile(alpha: float, dof: int) -> float:
    """The one-sided Student t quantile for `alpha` with `dof` degrees of freedom.

    `dof` 0 (unknown) or very large falls back to the normal quantile. Cached: the gate
    asks after every run, calibration thousands of times.
    """
    if dof <= 0 or dof > 10_000:
        return z_quantile(alpha)
    from scipy.special import stdtrit  # = scipy.stats.t.ppf, at a third of the import

    return float(stdtrit(dof, 1.0 - alpha))


@functools.lru_cache(maxsize=64)
def z_quantile(alpha: float) -> float:
    """The one-sided normal quantile for a false-alarm rate `alpha` (0.01 -> 2.326).

    Cached: the gate asks for it after every run and calibration thousands of times.
    """
    from scipy.special import ndtri  # = scipy.stats.norm.ppf

    return float(ndtri(1.0 - alpha))
