"""The one user-facing error type and the exit codes it maps to.

Every command ends in one of these codes; the CLI maps a `PerfguardError` to its code
in exactly one place (`perfguard.cli.main`), so library code never calls `sys.exit`.
"""

from __future__ import annotations

EXIT_OK = 0
"""No regression (and every case ran)."""
EXIT_REGRESSION = 1
"""At least one metric regressed beyond its tolerance band."""
EXIT_USAGE = 2
"""Usage, configuration or data error: bad flag, bad TOML/JSON, schema violation, ..."""
EXIT_CASE_FAILED = 3
"""A case failed to run (raised, ran out of memory, timed out) and nothing regressed; for
`history`, the archive's server is unreachable or the connection was lost mid-add: the
infrastructure failed, not the data."""

EXIT_CONTENDED = 4
"""No verdict on the code: a timed figure the check could not tell from its baseline
(*can't tell*: neither the same within its minimum effect nor credibly slower), or the
runner stayed much slower than at baseline time (its reference workload said so) after
bounded waits. The report says what would resolve it."""
EXIT_NO_VERDICT = EXIT_CONTENDED
EXIT_INTERNAL = 70
"""An internal error (a bug, or a library raising something unexpected): never a verdict.
70 is `EX_SOFTWARE` of BSD's sysexits.h."""
EXIT_INTERRUPTED = 130
"""Interrupted (SIGINT / Ctrl-C): 128 + 2, the shell's convention."""
EXIT_TERMINATED = 143
"""Terminated (SIGTERM): 128 + 15."""

EXIT_CODES_HELP = (
    "Exit codes: 0 same (no figure slower, none can't tell); 1 slower (at least one "
    "regression); 2 usage, configuration or data error; 3 a case failed to run (and "
    "nothing slower) or the history server is unreachable; 4 no verdict: can't tell (a "
    "timed figure neither the same nor credibly slower) or the runner was contended; "
    "70 internal error (never a verdict); 130 interrupted; 143 terminated."
)


class PerfguardError(Exception):
    """A user-facing error: a one-line reason and the exit code it ends the command with.

    The message should name the file and the field at fault, e.g.
    ``cases/cpu.toml: case 'qwen_tiny': steps: -1 is less than the minimum of 1``.
    """

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def __str__(self) -> str:  # one line, always
        return " ".join(str(self.args[0]).split()) if self.args else ""
