"""`[tool.perfguard]` in pyproject.toml: the knobs a team sets once, off the command line.

A command's `--help` lists what a user chooses per run (what to measure, against what,
where the reports go, `--fast` / `--rigorous`); the sampling and judging knobs
(`KNOBS`: runs, processes, confirmations, the level, the profile, ...) are hidden
there and read from the nearest `pyproject.toml` at or above the working directory,
as pytest, ruff and coverage read theirs:

    [tool.perfguard]
    repeats = 5            # every command that takes --repeats
    max-reruns = 8

    [tool.perfguard.compare]
    budget-s = 300         # only `perfguard compare`

A key is an option's long name without its dashes (`max-reruns`, `start-method`);
the command line, then an option's environment variable, win over the file. A key that
no command takes, or a value its option refuses, is an error naming the file and the key
(exit 2). docs/cli.md lists the knobs.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from perfguard.errors import PerfguardError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TABLE = "perfguard"

KNOBS = frozenset(
    {
        "repeats",
        "warmup",
        "timeout",
        "sync",
        "threads",
        "factory_spec",
        "progress",
        "devices_spec",
        "isolate",
        "start_method",
        "processes",
        "max_repeats",
        "max_reruns",
        "confirm_gap_s",
        "alpha",
        "profile",
        "all_metrics",
        "order_seed",
        "min_blocks",
        "max_blocks",
        "timing",
        "budget_s",
        "against_subdir",
        "cases_dir",
        "advisory",
        "fail_on_missing",
        "allow_busy",
        "timing_gate",
    }
)
"""Parameter names of the options that are knobs: hidden from `--help`, set in the table
or, when a run needs it, on the command line under the same name."""


def commands(group: click.Group, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    """Every command under `group`, by its path (`check`, `baselines merge`)."""
    for name, cmd in sorted(group.commands.items()):
        path = f"{prefix}{name}"
        if isinstance(cmd, click.Group):
            yield from commands(cmd, f"{path} ")
        else:
            yield path, cmd


def hide_knobs(group: click.Group) -> None:
    """Mark every knob option of every command hidden (its --help shows the choices)."""
    for _, cmd in commands(group):
        for param in cmd.params:
            if isinstance(param, click.Option) and param.name in KNOBS:
                param.hidden = True


def knobs_of(cmd: click.Command) -> dict[str, click.Option]:
    """`cmd`'s knob options by their key in the table (long name without dashes)."""
    out: dict[str, click.Option] = {}
    for param in cmd.params:
        if isinstance(param, click.Option) and param.name in KNOBS:
            for opt in param.opts:
                if opt.startswith("--"):
                    out[opt[2:]] = param
    return out


def find_pyproject(start: Path) -> tuple[Path, Any] | None:
    """The nearest pyproject.toml at or above `start` that has a [tool.perfguard] table,
    and that table (read once)."""
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            try:
                data = tomllib.loads(candidate.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
                raise PerfguardError(f"{candidate}: not valid TOML: {exc}") from None
            if TABLE in data.get("tool", {}):
                return candidate, data["tool"][TABLE]
    return None


def default_map(group: click.Group, start: Path | None = None) -> dict[str, Any] | None:
    """click's `default_map` for the commands of `group` from the nearest table (None
    when there is none): top-level keys for every command that takes them, a
    sub-table per command for that command only."""
    found = find_pyproject(start or Path.cwd())
    if found is None:
        return None
    path, table = found
    if not isinstance(table, dict):
        raise PerfguardError(f"{path}: tool.{TABLE}: must be a table")
    by_name = dict(commands(group))
    shared = {k: v for k, v in table.items() if not isinstance(v, dict)}
    own = {k: v for k, v in table.items() if isinstance(v, dict)}
    for name in own:
        if name not in by_name:
            raise PerfguardError(f"{path}: tool.{TABLE}.{name}: no such command")
    known = {key for cmd in by_name.values() for key in knobs_of(cmd)}
    for key in shared:
        if key not in known:
            raise PerfguardError(
                f"{path}: tool.{TABLE}.{key}: not a knob of any command (docs/cli.md)"
            )
    out: dict[str, Any] = {}
    for name, cmd in by_name.items():
        knobs = knobs_of(cmd)
        values = {k: v for k, v in shared.items() if k in knobs}
        for key, value in own.get(name, {}).items():
            if key not in knobs:
                raise PerfguardError(
                    f"{path}: tool.{TABLE}.{name}.{key}: not a knob of `perfguard {name}`"
                )
            values[key] = value
        if values:
            entry = {
                str(knobs[k].name): _checked(path, name, k, knobs[k], cmd, v)
                for k, v in values.items()
            }
            _put(out, name.split(" "), entry)
    return out


def _checked(
    path: Path, command: str, key: str, option: click.Option, cmd: click.Command, value: Any
) -> Any:
    """`value` as `option` takes it, or an error naming the file and key."""
    try:
        option.type_cast_value(click.Context(cmd), value)
    except click.BadParameter as exc:
        raise PerfguardError(
            f"{path}: tool.{TABLE}.{key}: {exc.message} for `perfguard {command}` (a value "
            f"for one command only goes under [tool.{TABLE}.{command.split()[0]}])"
        ) from None
    return value


def _put(tree: dict[str, Any], path: list[str], entry: dict[str, Any]) -> None:
    for part in path[:-1]:
        tree = tree.setdefault(part, {})
    tree[path[-1]] = entry
