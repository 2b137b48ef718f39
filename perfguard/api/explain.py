"""`perfguard explain`'s `--against DIR|REF`: the base its cases are profiled on beside this
checkout. The attribution itself is `perfguard.measurement.explain` (`explain`,
`attribute_regressions`)."""

from __future__ import annotations

from pathlib import Path

from perfguard.errors import PerfguardError
from perfguard.measurement.relative import RelativeOptions


def against_of(value: str, subdir: str | None) -> RelativeOptions:
    """`--against DIR|REF`: an existing directory is a checkout, anything else a revision
    of this repository (checked out in a temporary worktree), which must resolve."""
    if Path(value).is_dir():
        return RelativeOptions(directory=value, subdir=subdir)
    from perfguard.measurement.checkout import resolve_ref

    try:
        resolve_ref(value)
    except PerfguardError as exc:
        raise PerfguardError(f"--against {value}: not a directory, and {exc}") from exc
    return RelativeOptions(ref=value, subdir=subdir)
