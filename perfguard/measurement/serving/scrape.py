"""What a server says of its requests besides its answers: sglang's `performance.log`
lines and Prometheus `/metrics`, read forgivingly.

A malformed line or sample is one message naming the field, and it is counted; it never
ends a measurement (a server's logging is not the code under test). The stage times of
a perf-log line are joined to the answer by `request_id`, as sglang's CI does.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

QUEUE = "sglang:diffusion_queue_time_seconds"
STAGE = "sglang:diffusion_stage_host_latency_seconds"
LATENCY = "sglang:diffusion_request_latency_seconds"
REQUESTS = "sglang:diffusion_requests_total"
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass
class PerfLine:
    """One request of a perf log: its stages (ms) and denoising steps (ms)."""

    stages_ms: dict[str, float]
    steps_ms: list[float]


@dataclass
class PerfLog:
    """sglang's `performance.log`, read from where the last read ended."""

    path: Path
    offset: int = 0
    problems: list[str] = field(default_factory=list)

    def skip_to_end(self) -> None:
        self.offset = os.path.getsize(self.path) if self.path.exists() else 0

    def read_new(self) -> dict[str, PerfLine]:
        """The complete lines written since the last read, by request id."""
        if not self.path.exists():
            return {}
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self.offset += end
        out: dict[str, PerfLine] = {}
        for raw in data[:end].decode("utf-8", "replace").split("\n"):
            if raw.strip():
                parsed = self._line(raw)
                if parsed is not None:
                    out[parsed[0]] = parsed[1]
        return out

    def _line(self, raw: str) -> tuple[str, PerfLine] | None:
        try:
            return perf_line(json.loads(raw))
        except (ValueError, TypeError) as exc:
            self.problems.append(f"{self.path}: malformed line: {exc}")
            return None


def _ms(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}: expected a number of ms, found {value!r}")
    return float(value)


def perf_line(obj: Any) -> tuple[str, PerfLine]:
    """(request id, stages and steps) of one perf-log record; `ValueError` names the field."""
    if not isinstance(obj, Mapping):
        raise ValueError("expected a JSON object")
    rid = obj.get("request_id")
    if not isinstance(rid, str) or not rid:
        raise ValueError("request_id: missing")
    stages: dict[str, float] = {}
    raw = obj.get("stages")
    if not isinstance(raw, list):
        raise ValueError("stages: expected a list")
    for i, st in enumerate(raw):
        if not isinstance(st, Mapping) or not isinstance(st.get("name"), str):
            raise ValueError(f"stages[{i}].name: missing")
        ms = _ms(st.get("execution_time_ms"), f"stages[{i}].execution_time_ms")
        stages[st["name"]] = stages.get(st["name"], 0.0) + ms
    steps = obj.get("steps") or []
    if not isinstance(steps, list):
        raise ValueError("steps: expected a list of ms")
    return rid, PerfLine(stages, [_ms(v, f"steps[{i}]") for i, v in enumerate(steps)])


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_metrics(text: str, problems: list[str] | None = None) -> Samples:
    """Prometheus text as (name, sorted labels) -> value; a malformed sample is a problem."""
    out: Samples = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        try:
            if m is None:
                raise ValueError("not a sample")
            value = float(m.group(3))
        except ValueError:
            if problems is not None:
                problems.append(f"/metrics: malformed sample: {line[:120]}")
            continue
        labels = tuple(sorted(_LABEL.findall(m.group(2) or "")))
        out[(m.group(1), labels)] = value
    return out


def mean_ms(before: Samples, after: Samples, name: str, **labels: str) -> float | None:
    """The mean of a histogram's new observations between two reads, in ms."""
    key = tuple(sorted(labels.items()))
    count = after.get((f"{name}_count", key), 0.0) - before.get((f"{name}_count", key), 0.0)
    total = after.get((f"{name}_sum", key), 0.0) - before.get((f"{name}_sum", key), 0.0)
    return total / count * 1e3 if count > 0 else None


def stages_of(samples: Samples) -> list[str]:
    """The stage labels of sglang's per-stage histogram."""
    return sorted(
        {dict(labels).get("stage", "") for (n, labels) in samples if n == f"{STAGE}_count"} - {""}
    )
