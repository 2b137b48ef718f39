"""Output equivalence: whether a case's output is the baseline's, bit for bit or within
a tolerance.

Every reference optimization is exact math, so a performance change must leave the
output bit-identical (`output_hash`, a SHA-256 of the output). When it is not, a compact
reference (`OutputSketch`: the output, or block means of it at most `SKETCH_VALUES`
values) gives the max abs diff and the PSNR against the baseline's:

- **bit-identical**: the hashes match;
- **within tolerance**: PSNR >= `OUTPUT_PSNR_DB` (100 dB): float32 reassociation (another
  BLAS blocking, a fused kernel) leaves ~120 dB, a block computed in bfloat16 ~80 dB;
- **changed**: below it. A changed output fails the case (exit 1) unless the case
  (`output_may_change = true`) or the command (`--allow-output-change`) says this change
  is meant to change numerics; it is then reported, not failed.
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

BIT_IDENTICAL = "bit-identical"
WITHIN_TOLERANCE = "within-tolerance"
CHANGED = "changed"
UNCOMPARED = "not-compared"

OUTPUT_PSNR_DB = 100.0
"""An output whose PSNR against the baseline's is at least this, 100 dB, is within
tolerance. Reordered float32 arithmetic leaves ~120 dB and more; every DiT block rounded
through bfloat16 gives 78 dB (`benchmarks/counters.py`): the threshold sits 20 dB from
each (docs/measurements/2026-12-07-constants.md)."""

SKETCH_VALUES = 4096
"""The most values a compact reference keeps (16 KiB of float32, ~22 KB in the file)."""


@dataclass(frozen=True)
class OutputSketch:
    """A compact, fixed reference of a case's output: its shape and block means.

    `values` are the output itself when it has at most `SKETCH_VALUES` elements, else
    the means of equal blocks of its last two dimensions (an image downsampled), so that
    two sketches of the same shape compare position by position. `exact` says no
    averaging took place (the max abs diff is then the output's own).
    """

    shape: tuple[int, ...]
    sketch_shape: tuple[int, ...]
    values: tuple[float, ...]

    @property
    def exact(self) -> bool:
        return self.shape == self.sketch_shape

    def to_json(self) -> dict[str, Any]:
        data = struct.pack(f"<{len(self.values)}f", *self.values)
        return {
            "shape": list(self.shape),
            "sketch_shape": list(self.sketch_shape),
            "float32_le_base64": base64.b64encode(data).decode("ascii"),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OutputSketch:
        raw = base64.b64decode(str(data["float32_le_base64"]), validate=True)
        if len(raw) % 4:
            raise ValueError("float32_le_base64 is not a whole number of float32 values")
        values = struct.unpack(f"<{len(raw) // 4}f", raw)
        shape = tuple(int(x) for x in data["sketch_shape"])
        if math.prod(shape) != len(values):
            raise ValueError(f"{len(values)} values for a sketch of shape {list(shape)}")
        return cls(tuple(int(x) for x in data["shape"]), shape, tuple(values))


@dataclass(frozen=True)
class OutputVerdict:
    """Whether a case's output is what the baseline's was, and by how much it moved."""

    verdict: str
    allowed: bool = False
    max_abs_diff: float | None = None
    psnr_db: float | None = None
    reason: str = ""

    @property
    def failed(self) -> bool:
        """A changed output fails the case unless a change was allowed."""
        return self.verdict == CHANGED and not self.allowed

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"verdict": self.verdict, "allowed": self.allowed}
        if self.max_abs_diff is not None:
            out["max_abs_diff"] = float(f"{self.max_abs_diff:.6g}")
        if self.psnr_db is not None:
            out["psnr_db"] = None if math.isinf(self.psnr_db) else round(self.psnr_db, 2)
        if self.reason:
            out["reason"] = self.reason
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OutputVerdict:
        psnr = data.get("psnr_db")
        return cls(
            verdict=str(data["verdict"]),
            allowed=bool(data.get("allowed", False)),
            max_abs_diff=None if data.get("max_abs_diff") is None else float(data["max_abs_diff"]),
            psnr_db=None if psnr is None else float(psnr),
            reason=str(data.get("reason", "")),
        )


def compare_sketches(current: OutputSketch, baseline: OutputSketch) -> tuple[float, float] | None:
    """(max abs diff, PSNR in dB) of two sketches of one shape, or None when they differ.

    PSNR is `20 log10(range / rms)` with the range of the baseline's values (inf when
    the values are equal).
    """
    if current.shape != baseline.shape or current.sketch_shape != baseline.sketch_shape:
        return None
    diffs = [abs(a - b) for a, b in zip(current.values, baseline.values, strict=True)]
    if not diffs:
        return None
    if any(not math.isfinite(d) for d in diffs):
        return math.inf, -math.inf
    peak = max(baseline.values) - min(baseline.values) or 1.0
    rms = math.sqrt(sum(d * d for d in diffs) / len(diffs))
    psnr = math.inf if rms == 0 else 20.0 * math.log10(peak / rms)
    return max(diffs), psnr


def judge_output(
    current_hash: str | None,
    current: OutputSketch | None,
    baseline_hash: str | None,
    baseline: OutputSketch | None,
    *,
    allowed: bool = False,
    psnr_db: float = OUTPUT_PSNR_DB,
) -> OutputVerdict | None:
    """Bit-identical, within tolerance or changed; None when there is nothing to compare."""
    if current_hash is None or baseline_hash is None:
        return None
    if current_hash == baseline_hash:
        return OutputVerdict(BIT_IDENTICAL, allowed)
    if current is None or baseline is None:
        return OutputVerdict(
            CHANGED,
            allowed,
            reason="the output hash differs and one side keeps no reference to measure by how much",
        )
    figures = compare_sketches(current, baseline)
    if figures is None:
        return OutputVerdict(
            CHANGED,
            allowed,
            reason=f"output shape {list(current.shape)}, baseline {list(baseline.shape)}",
        )
    max_abs, psnr = figures
    where = "" if current.exact else " (block means)"
    if psnr >= psnr_db:
        return OutputVerdict(
            WITHIN_TOLERANCE,
            allowed,
            max_abs,
            psnr,
            f"not bit-identical; PSNR {psnr:.1f} dB >= {psnr_db:g} dB{where}",
        )
    reason = f"PSNR {_db(psnr)} < {psnr_db:g} dB, max abs diff {max_abs:.3g}{where}"
    if allowed:
        reason += "; allowed (output_may_change / --allow-output-change)"
    return OutputVerdict(CHANGED, allowed, max_abs, psnr, reason)


def _db(psnr: float) -> str:
    return "-inf dB" if psnr == -math.inf else f"{psnr:.1f} dB"


def output_allowed(case: Mapping[str, Any], allow: bool) -> bool:
    """Whether the case definition or the command allows the output to change."""
    return bool(allow or case.get("output_may_change", False))
