"""The measurement settings: one frozen value, built once by the CLI and passed down.

Every figure is only as good as the settings it was measured under (warm-up, repeats,
synchronization, threads), so they travel together and are recorded together: the
runner, the worker processes, the gate and the relative check all take one
`MeasureOptions` instead of a dozen keyword arguments each. Pure Python: building one
never imports torch.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfguard.errors import PerfguardError

SYNC_POLICIES = ("none", "stage")
ENV_FACTORY = "PERFGUARD_FACTORY"

WORKER_FIELDS = (
    "repeats",
    "warmup",
    "timeout",
    "sync",
    "inject",
    "factory",
    "counters_only",
    "count_work",
)
"""What a worker process needs of the options (besides the platform's name): the
request's `options` object on the wire (`perfguard.measurement.worker`). `counters_only`
and `count_work` travel only when they differ from their defaults, so the wire is what
worker protocol 1 was for an older base revision of a relative check (which ignores
what it does not know: it then counts, which costs time, not correctness)."""

_WIRE_DEFAULTS = {"counters_only": False, "count_work": True}

COUNTED_PROCESSES = 2
"""How many of a case's processes also make the untimed counted run (`count_work`): counts
are exact, so one build gives them and a second checks that they do not depend on the
build (where they do, the baseline keeps their range). A counted run costs about a smoke
process's timed runs, so counting in every process of a 6-process baseline would spend a
third of its time recounting; the relative check likewise counts in its first blocks only
(`perfguard.measurement.paired_blocks.Side.later`)."""

_MEASURED = ("repeats", "warmup", "timeout", "sync", "inject", "counters_only", "max_repeats")
_REPORTED = ("repeats", "warmup", "sync", "inject", "devices", "start_method")
SETTINGS_RECORDS: dict[str, tuple[str, ...]] = {
    "results": _MEASURED,
    "workers": (*_MEASURED, "devices", "isolate", "start_method", "factory", "processes"),
    "check": (*_REPORTED, "max_repeats", "processes", "isolate"),
    "counters": (*_REPORTED, "counters_only"),
    "relative": (*_REPORTED, "factory"),
}
"""The keys of each run-settings record (`MeasureOptions.settings`): a results file of
cases run in this process or in workers, and the report of each kind of check."""


@dataclass(frozen=True)
class MeasureOptions:
    """How to measure: the settings of `run`, `gen-baselines`, `check` and `calibrate`.

    - `repeats` measured runs after `warmup` untimed ones per build: the first calls pay
      one-off costs (allocator growth, autotuning, lazy initialisation) that a serving
      process pays once, not per request.
    - `timeout`: seconds a case may take; past it the case is an error, the others run.
    - `sync`: `"none"` resolves device events once per run; `"stage"` synchronizes at
      every stage boundary (debugging: it serializes host and device, so it changes
      what is measured).
    - `threads`: torch intra-op threads for every case (None: the case's `threads`, else
      the platform default, `perfguard.device.threads`).
    - `inject`: stage -> fractional slowdown, real busy work inside the stage, to prove a
      gate catches what it should.
    - `factory`: `MODULE:FUNCTION` building each pipeline instead of perfguard's workloads.
    - `devices`, `isolate`, `processes`: where the runs happen. One worker process per
      device; a fresh process per case; K fresh processes per case, pooled, because the
      process is the largest source of noise on a shared runner.
    - `max_repeats`: adaptive sampling's cap (None: exactly `repeats`); a case run in
      this process keeps measuring until its verdicts are clear or the cap is reached.
    - `progress`: a progress bar (None: only on a terminal).
    - `counters_only`: no timed runs: each build runs its warm-up (at least one run, whose
      output is the one compared) and one counted run (`perfguard.measurement.work`);
      seconds on any CPU runner, and exact.
    - `count_work`: run the build's untimed counted run (`perfguard.measurement.work`;
      on CPU it also measures the tensor memory). Counts are exact, so a measurement
      of many processes needs them from a few builds, not from every one: the counted
      run costs ~3x a plain run, about half of what a fresh smoke process measures.
      A case's K processes count in the first `COUNTED_PROCESSES` (`for_process`), and
      a check's confirmations do not count (its first measurement did).
    - `start_method`: how worker processes start (`perfguard.measurement.launch`):
      `spawn`, a fresh interpreter that imports everything, or `forkserver`, a fork of a
      server that imported torch, transformers, diffusers and perfguard once (None: the
      platform's default, `forkserver` on Linux). Either way a worker is a new process
      that has measured nothing; docs/verdicts.md has the spread of each.
    """

    repeats: int = 5
    warmup: int = 1
    timeout: float | None = None
    sync: str = "none"
    threads: int | None = None
    inject: Mapping[str, float] = field(default_factory=dict)
    factory: str | None = None
    devices: tuple[str, ...] | None = None
    isolate: bool = False
    processes: int = 1
    max_repeats: int | None = None
    progress: bool | None = None
    counters_only: bool = False
    start_method: str | None = None
    count_work: bool = True

    def __post_init__(self) -> None:
        if self.repeats < 1 or self.warmup < 0:
            raise PerfguardError("--repeats must be >= 1 and --warmup >= 0")
        if self.processes < 1:
            raise PerfguardError("--processes must be >= 1")
        if self.threads is not None and self.threads < 1:
            raise PerfguardError("--threads must be >= 1")
        if self.sync not in SYNC_POLICIES:
            raise PerfguardError(f"--sync must be one of {', '.join(SYNC_POLICIES)}")
        if self.timeout is not None and self.timeout <= 0:
            raise PerfguardError("--timeout must be > 0")
        from perfguard.measurement.launch import resolve_start_method

        object.__setattr__(self, "start_method", resolve_start_method(self.start_method))
        # Plain, hashable-enough values, whatever the caller passed.
        object.__setattr__(self, "inject", dict(self.inject))
        if self.devices is not None:
            object.__setattr__(self, "devices", tuple(self.devices))

    def replace(self, **changes: Any) -> MeasureOptions:
        return dataclasses.replace(self, **changes)

    def for_process(self, index: int) -> MeasureOptions:
        """The options of a case's `index`-th process (from 0) of `processes`: it counts
        its work only among the first `COUNTED_PROCESSES`, and never where these say not to."""
        if index < COUNTED_PROCESSES or not self.count_work:
            return self
        return self.replace(count_work=False)

    @property
    def isolated(self) -> bool:
        """Whether every case runs in a fresh worker process (`isolate`, `processes` > 1)."""
        return self.isolate or self.processes > 1

    def uses_workers(self, cases: Sequence[Any]) -> bool:
        """Whether the cases run in worker processes rather than in this one.

        Workers are used with `devices`, `isolate` or `processes` > 1, and whenever a case
        needs more than one device (only torchrun can give it that).
        """
        return bool(
            self.devices
            or self.isolate
            or self.processes > 1
            or any(c.num_devices > 1 for c in cases)
        )

    def settings(self, record: str = "results", *, adaptive: bool = False) -> dict[str, Any]:
        """The measurement keys of a run-settings record: how its figures were measured.

        Each record holds the keys `SETTINGS_RECORDS` lists for it (the caller adds what
        is not measurement: the source, the shard, a check's confirmations):

        - `results`: a results file of cases run in this process; `max_repeats` only
          where sampling was `adaptive` (an `until` was consulted).
        - `workers`: a results file of cases run in worker processes: also where they
          ran (`devices` as a list, `isolate` true with `processes` > 1 too, which
          runs every case in a fresh process) and `processes` where > 1.
        - `check`, `counters`, `relative`: the report of a check of each kind; `devices`
          comma-joined, `isolate` as asked, and `max_repeats` the most runs a first
          measurement may take (`repeats` where sampling is not adaptive).

        `counters_only` appears where it is set.
        """
        from perfguard.device.inject import describe

        if record not in SETTINGS_RECORDS:
            raise ValueError(f"no settings record {record!r}")
        report = record not in ("results", "workers")
        devices = list(self.devices) if self.devices is not None else None
        values: dict[str, Any] = {
            "repeats": self.repeats,
            "warmup": self.warmup,
            "timeout": self.timeout,
            "sync": self.sync,
            "inject": describe(dict(self.inject)),
            "counters_only": True,
            "max_repeats": (self.max_repeats or self.repeats) if report else self.max_repeats,
            "devices": (",".join(devices) if devices else None) if report else devices,
            "isolate": self.isolate if report else self.isolated,
            "start_method": self.start_method,
            "factory": self.factory,
            "processes": self.processes,
        }
        left_out = {
            "counters_only": not self.counters_only,
            "max_repeats": not report and not adaptive,
            "processes": record == "workers" and self.processes == 1,
        }
        return {k: values[k] for k in SETTINGS_RECORDS[record] if not left_out.get(k, False)}

    def to_worker_json(self, platform: str) -> dict[str, Any]:
        """The request's `options` for a worker process (`WORKER_FIELDS` + the platform)."""
        out: dict[str, Any] = {"platform": platform}
        for name in WORKER_FIELDS:
            value = getattr(self, name)
            if name in _WIRE_DEFAULTS and value == _WIRE_DEFAULTS[name]:
                continue  # absent unless asked: the wire stays what older workers read
            out[name] = dict(value) if name == "inject" else value
        return out

    @classmethod
    def from_worker_json(cls, data: Mapping[str, Any]) -> tuple[str, MeasureOptions]:
        """The inverse of `to_worker_json`: the platform's name and the options."""
        known = {f.name for f in dataclasses.fields(cls)}
        return str(data["platform"]), cls(**{k: v for k, v in data.items() if k in known})


def parse_devices(text: str | None) -> list[str] | None:
    """`'0,1'` -> `['0', '1']`; None or '' -> None (no worker processes asked for).

    Entries are what the platform's visible-devices variable accepts: indices, or GPU
    UUIDs (`GPU-8f3...`); each may appear once.
    """
    if text is None or not text.strip():
        return None
    devices = [d.strip() for d in text.split(",")]
    bad = [d for d in devices if not d or not all(ch.isalnum() or ch in "-_:" for ch in d)]
    if bad:
        raise PerfguardError(f"--devices {text!r}: expected a comma-separated list like 0,1")
    dupes = sorted({d for d in devices if devices.count(d) > 1})
    if dupes:
        raise PerfguardError(f"--devices {text!r}: device {dupes[0]} is listed twice")
    return devices


def factory_from(option: str | None) -> str | None:
    """The factory spec asked for by a CLI option, else by `$PERFGUARD_FACTORY`."""
    spec = option if option is not None else os.environ.get(ENV_FACTORY)
    return spec.strip() if spec and spec.strip() else None
