"""Fault injection for the gate self-test: slow one named stage by a known fraction.

`PERFGUARD_INJECT='DenoisingStage=+10%'` (or `--inject` on `run` / `check`) makes the
stage timer busy-wait for 10 % of that stage's own measured time, so a CI owner can prove
that the gate catches a slowdown of that size. The wait is spent at the end of each
denoising step inside the stage (10 % of the step's time) and the rest at the end of the
stage, so `stage:DenoisingStage`, every `step:<i>`, `step_avg` and `step_median` move
by 10 %, the enclosing stages and `e2e` by the time added, and no other stage moves
(`perfguard.device.timer.StageTimer._slow_down`). It is off by
default and `gen-baselines` refuses it: a baseline must never contain injected time.

A stage is named by its full path as the timer records it (`Outer/Inner` for a nested
one). A name that matched no stage of a run is an error (`InjectionUnmatched`, exit 2),
raised by the timer when the run is recorded: otherwise a typo would inject nothing
while the report says the injection was made, and the self-test would prove nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from perfguard.errors import PerfguardError

ENV_INJECT = "PERFGUARD_INJECT"
_ITEM = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*=\s*\+?\s*(\d+(?:\.\d+)?)\s*%\s*$")


def parse_inject(spec: str | None) -> dict[str, float]:
    """`'DenoisingStage=+10%,DecodingStage=+5%'` -> `{'DenoisingStage': 0.1, ...}`."""
    if not spec or not spec.strip():
        return {}
    out: dict[str, float] = {}
    for item in spec.split(","):
        m = _ITEM.match(item)
        if not m:
            raise PerfguardError(
                f"inject: cannot parse {item.strip()!r}: expected STAGE=+N% "
                "(e.g. DenoisingStage=+10%)"
            )
        fraction = float(m.group(2)) / 100.0
        if fraction <= 0 or fraction > 10:
            raise PerfguardError(f"inject: {item.strip()!r}: fraction must be in (0, 1000] %")
        out[m.group(1)] = fraction
    return out


def inject_from(option: str | None) -> dict[str, float]:
    """The injection asked for by a CLI option, else by `$PERFGUARD_INJECT`."""
    return parse_inject(option if option is not None else os.environ.get(ENV_INJECT))


def describe(inject: dict[str, float]) -> str | None:
    if not inject:
        return None
    return ",".join(f"{k}=+{v * 100:g}%" for k, v in sorted(inject.items()))


class InjectionUnmatched(PerfguardError):
    """An injected stage name matched no stage of a run (exit 2, a usage error).

    Its own type so that the runner lets it end the command instead of recording it as
    one case's failure: the mistake is in the command line, not in the case.
    """


def check_matched(inject: dict[str, float], stages: Iterable[str]) -> None:
    """Raise `InjectionUnmatched` when a name in `inject` is not among the run's `stages`."""
    ran = list(stages)
    missed = sorted(set(inject) - set(ran))
    if not missed:
        return
    hint = ""
    for name in missed:
        nested = [s for s in ran if s.endswith("/" + name)]
        if nested:
            hint = f" ({name} is nested: name it {nested[0]})"
            break
    raise InjectionUnmatched(
        f"inject {describe(inject)}: no stage named {', '.join(missed)} ran{hint}; "
        f"stages that ran: {', '.join(ran) or 'none'}"
    )
