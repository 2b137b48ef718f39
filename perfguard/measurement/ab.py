"""Interleaved A/B comparison of two variants of one case, in one process.

This is how a PR author proves a win. Both variants are built once, warmed up, then run
in ABBA order (A B B A A B B A ...): interleaving puts both variants under the same drift
(thermal state, other tenants, clock boosts), and the ABBA pattern cancels a linear trend
that plain ABAB would attribute to the second variant. Each adjacent A/B pair of runs is
a block, and the comparison is the relative check's paired estimate on the blocks' log
ratios B/A (`perfguard.decision.estimate`: Yuen's trimmed mean, its t-interval at the
relative level), answered by the one rule (`perfguard.decision.answer`): B is *slower*,
the *same* (or *faster*), or *can't tell*, with the smallest slowdown the pairs could
have shown. A ratio below 1 means B is faster.

When the variants differ only in optimization toggles and the pipeline can switch them
(`set_toggles`, as the built-in pipelines do), one pipeline is built and its toggles are
flipped before each run: toggles change code paths, not weights, and two copies of a
`full` model (2 x 20.4 B bf16 parameters for Qwen-Image) do not fit one 80 GB device.

On CPU the peak-memory figure is the process's peak RSS, which includes the loaded
model(s), so its ratio is close to 1 by construction; on CUDA/NPU it is the allocator's
peak of each run and compares the variants' working memory directly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfguard.decision.answer import Answer
from perfguard.decision.comparison import RELATIVE_ALPHA
from perfguard.decision.estimate import PairedEstimate, paired_estimate
from perfguard.decision.stats import summarize
from perfguard.decision.tolerances import min_effect
from perfguard.device.platform import Platform
from perfguard.device.timer import StageTimer
from perfguard.errors import PerfguardError
from perfguard.measurement.runner import PipelineFactory, _default_factory
from perfguard.metrics import metric_sort_key, metrics_of_run
from perfguard.storage.cases import TOGGLES, Case

# Case fields a variant may set besides toggles (scalar sampling parameters).
_VARIANT_FIELDS = {"serial_cfg", "guidance_scale", "dtype", "steps", "batch", "seed"}


def parse_variant(spec: str) -> dict[str, Any]:
    """`'qwen_modulation_cache=false,serial_cfg=true'` -> `{...: False, ...: True}`."""
    out: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key:
            raise PerfguardError(f"variant {spec!r}: expected key=value pairs, got {item!r}")
        if key not in TOGGLES and key not in _VARIANT_FIELDS:
            known = ", ".join(sorted((*TOGGLES, *_VARIANT_FIELDS)))
            raise PerfguardError(f"variant {spec!r}: unknown key {key!r} (known: {known})")
        out[key] = _coerce(key, raw, spec)
    return out


def _coerce(key: str, raw: str, spec: str) -> Any:
    if key in TOGGLES or key == "serial_cfg":
        if raw.lower() in ("1", "true", "on", "yes"):
            return True
        if raw.lower() in ("0", "false", "off", "no"):
            return False
        raise PerfguardError(f"variant {spec!r}: {key} must be true or false, not {raw!r}")
    if key == "dtype":
        if raw not in ("float32", "bfloat16", "float16"):
            raise PerfguardError(f"variant {spec!r}: dtype {raw!r} is not a known dtype")
        return raw
    try:
        return float(raw) if key == "guidance_scale" else int(raw)
    except ValueError as exc:
        raise PerfguardError(f"variant {spec!r}: {key} must be a number, not {raw!r}") from exc


def apply_variant(case: Case, variant: dict[str, Any]) -> Case:
    toggles = {k: v for k, v in variant.items() if k in TOGGLES}
    fields = {k: v for k, v in variant.items() if k not in TOGGLES}
    out = case.with_toggles(**toggles) if toggles else case
    if "batch" in fields and "prompt_lengths" not in fields:
        cycled = list(case.prompt_lengths) * fields["batch"]
        fields["prompt_lengths"] = tuple(cycled[: fields["batch"]])
    return dataclasses.replace(out, **fields) if fields else out


def toggle_variants(names: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`--toggle X`: A is the reference (X off), B the optimization (X on)."""
    for name in names:
        if name not in TOGGLES:
            raise PerfguardError(f"--toggle {name!r}: choose from {', '.join(TOGGLES)}")
    return {n: False for n in names}, {n: True for n in names}


@dataclass(frozen=True)
class MetricComparison:
    """One metric of an A/B run: the medians, the paired estimate B/A over the pairs,
    and its answer (`estimate.decision`, `answer`: as in a relative check's report)."""

    metric: str
    median_a: float
    median_b: float
    estimate: PairedEstimate
    answer: Answer
    n_a: int
    n_b: int

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "median_a": self.median_a,
            "median_b": self.median_b,
            "ratio": round(self.estimate.ratio, 4),
            "ratio_low": round(self.estimate.low, 4),
            "ratio_high": round(self.estimate.high, 4),
            "paired": self.estimate.to_json(),
            "answer": self.answer.to_json(),
            "n_a": self.n_a,
            "n_b": self.n_b,
        }


@dataclass
class ABResult:
    case_id: str
    variant_a: dict[str, Any]
    variant_b: dict[str, Any]
    order: list[str] = field(default_factory=list)
    samples_a: dict[str, list[float]] = field(default_factory=dict)
    samples_b: dict[str, list[float]] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)
    shared_model: bool = False

    def comparisons(self, metrics: Sequence[str] | None = None) -> list[MetricComparison]:
        names = metrics or sorted(
            (m for m in self.samples_a if m in self.samples_b and not m.startswith("step:")),
            key=metric_sort_key,
        )
        out = []
        for name in names:
            a, b = self.samples_a[name], self.samples_b[name]
            # The k-th A run and the k-th B run are one ABBA pair, next to each other.
            logs = [math.log(y / x) for x, y in zip(a, b, strict=False) if x > 0 and y > 0]
            if len(logs) < 2:
                continue
            effect = min_effect(name)
            est = paired_estimate(logs, effect, RELATIVE_ALPHA)
            out.append(
                MetricComparison(
                    metric=name,
                    median_a=summarize(a).median,
                    median_b=summarize(b).median,
                    estimate=est,
                    answer=est.answer,
                    n_a=len(a),
                    n_b=len(b),
                )
            )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case_id,
            "a": self.variant_a,
            "b": self.variant_b,
            "order": "".join(self.order),
            "shared_model": self.shared_model,
            "outputs_identical": len(set(self.hashes.values())) == 1,
            "output_hashes": self.hashes,
            "comparisons": [c.to_json() for c in self.comparisons()],
            "samples": {"a": self.samples_a, "b": self.samples_b},
        }


def only_toggles(variant_a: dict[str, Any], variant_b: dict[str, Any]) -> bool:
    """Whether the two variants differ in optimization toggles only (same weights)."""
    return all(k in TOGGLES for k in (*variant_a, *variant_b))


def abba_order(pairs: int) -> list[str]:
    """`pairs` A/B pairs in ABBA blocks: 2 -> ABBA, 3 -> ABBAAB."""
    seq: list[str] = []
    for i in range(pairs):
        seq += ["A", "B"] if i % 2 == 0 else ["B", "A"]
    return seq


def run_ab(
    case: Case,
    variant_a: dict[str, Any],
    variant_b: dict[str, Any],
    platform: Platform,
    *,
    pairs: int = 10,
    warmup: int = 1,
    factory: PipelineFactory | None = None,
    on_run: Callable[[int, int], None] | None = None,
) -> ABResult:
    """Run both variants interleaved; every run timed with a fresh `StageTimer`."""
    if pairs < 2:
        raise PerfguardError("--pairs must be at least 2")
    from perfguard.measurement.runner import tensor_hash

    build = factory or _default_factory
    cases = {"A": apply_variant(case, variant_a), "B": apply_variant(case, variant_b)}
    pipes = {"A": build(cases["A"], platform)}
    shared = only_toggles(variant_a, variant_b) and callable(
        getattr(pipes["A"], "set_toggles", None)
    )
    pipes["B"] = pipes["A"] if shared else build(cases["B"], platform)

    def select(name: str) -> Callable[[], Any]:
        if shared:
            pipes[name].set_toggles(dict(cases[name].toggles))  # type: ignore[attr-defined]
        return pipes[name]

    result = ABResult(case.id, variant_a, variant_b, shared_model=shared)
    for name in ("A", "B"):
        for _ in range(warmup):
            result.hashes[name] = tensor_hash(select(name)())
    order = abba_order(pairs)
    for i, name in enumerate(order):
        pipe = select(name)  # outside the timer: switching is not part of a run
        with StageTimer(platform) as timer:
            out = pipe()
        record = metrics_of_run(timer.record().to_dict())
        target = result.samples_a if name == "A" else result.samples_b
        for metric, value in record.items():
            target.setdefault(metric, []).append(value)
        result.hashes[name] = tensor_hash(out)
        result.order.append(name)
        if on_run is not None:
            on_run(i + 1, len(order))
    pipes.clear()
    platform.empty_cache()
    return result
