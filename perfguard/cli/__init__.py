"""The `perfguard` command line: each command parses, calls the library, renders the result.

One module per command group (`run`, `check`, `calibrate`, `baselines`, `report`,
`history`, `cases`); the options they share are declared once in `common`; `app` holds
the group and `run_main()`, the one place that maps errors to exit codes.

`main` (the console script) imports the commands inside it, so that an import that fails
(a broken dependency, a damaged install) ends on the same one exit path as every other
error: one line and exit 70, never a bare traceback and exit 1, which CI reads as a
regression.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["cli", "main"]


def main(argv: list[str] | None = None) -> None:
    """The console script: a measuring command runs in a fork of the resident server
    (`perfguard.measurement.resident`) where one serves; otherwise, and in that fork,
    import the commands, then run them through the one exit path."""
    if _resident_exit(sys.argv[1:] if argv is None else argv):
        return
    try:
        from perfguard.cli.app import run_main
    except BaseException as exc:  # an install whose imports fail: still one line, exit 70
        if isinstance(exc, SystemExit):
            raise
        from perfguard.errors import EXIT_INTERNAL

        reason = " ".join(str(exc).split()) or "(no message)"
        sys.stderr.write(
            f"perfguard: internal error (exit {EXIT_INTERNAL}, not a verdict): the command line "
            f"could not be imported: {type(exc).__name__}: {reason[:300]}; check the install "
            "(pip install -e . in a fresh environment)\n"
        )
        sys.exit(EXIT_INTERNAL)
    run_main(argv)


def _resident_exit(argv: list[str]) -> bool:
    """Run `argv` through the resident server and exit with its status; False where it
    does not go through one. A bad `$PERFGUARD_SERVER_IDLE_S` is exit 2, like any usage
    error. The one import of the command line from below the library's commands: it
    runs before any of them is imported, so that a forked command pays for none."""
    from perfguard.errors import EXIT_USAGE, PerfguardError
    from perfguard.measurement.resident import run_command

    try:
        code = run_command(argv)
    except PerfguardError as exc:
        sys.stderr.write(f"perfguard: {exc}\n")
        sys.exit(EXIT_USAGE)
    if code is None:
        return False
    sys.exit(code)


def __getattr__(name: str) -> Any:  # `from perfguard.cli import cli`, imported on first use
    if name == "cli":
        from perfguard.cli.app import cli

        return cli
    raise AttributeError(f"module 'perfguard.cli' has no attribute {name!r}")
