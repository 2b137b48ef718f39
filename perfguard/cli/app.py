"""The `perfguard` group, its commands, and the one exit path of every command.

Library modules do the work and raise `PerfguardError` for anything the user got wrong;
`run_main()` is the one place that turns it into a one-line message and an exit code.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from perfguard import __version__
from perfguard.cli import (
    baselines,
    calibrate,
    cases,
    check,
    config,
    history,
    report,
    run,
    server,
)
from perfguard.cli.bisect import bisect_command
from perfguard.cli.common import CONTEXT_SETTINGS
from perfguard.cli.explain import explain_command
from perfguard.cli.serve import serve_command
from perfguard.errors import (
    EXIT_CODES_HELP,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    PerfguardError,
)

# ---- group -------------------------------------------------------------------------------------


@click.group(context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@click.version_option(__version__, prog_name="perfguard")
@click.option(
    "--debug",
    is_flag=True,
    help="On an internal error (exit 70), print the traceback too (env: PERFGUARD_DEBUG=1).",
)
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """perfguard: stage-level performance baselines and a CI gate for diffusion serving.

    The knobs (runs, processes, confirmations, the level, ...) live in a
    [tool.perfguard] table of pyproject.toml; docs/cli.md lists them."""
    _DEBUG[0] = debug
    mapping = config.default_map(cli)
    if mapping:
        ctx.default_map = mapping


for _command in (
    cases.env,
    cases.list_cases,
    run.run_command,
    run.gen_baselines,
    check.check,
    check.compare,
    check.check_work,
    check.judge_command,
    calibrate.calibrate_command,
    calibrate.ab_command,
    baselines.baselines_group,
    report.report_group,
    report.merge_command,
    history.history_group,
    server.server_group,
    explain_command,
    bisect_command,
    serve_command,
):
    cli.add_command(_command)
config.hide_knobs(cli)

ENV_DEBUG = "PERFGUARD_DEBUG"
_DEBUG = [False]  # --debug of the command being run (main resets it)
ENV_TRACEBACK_DIR = "PERFGUARD_TRACEBACK_DIR"


class Terminated(BaseException):
    """Raised by the SIGTERM handler, so that a terminated command unwinds like an
    interrupted one: `finally` blocks run, locks are released, an atomic write in
    progress removes its temporary file, and the previous file stays whole."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated


def _debug() -> bool:
    env = os.environ.get(ENV_DEBUG, "").strip().lower() not in ("", "0", "false", "no")
    return _DEBUG[0] or env


def _report_internal(exc: BaseException) -> None:
    """One stderr line naming the error and the file holding its traceback.

    The traceback goes to a file rather than the log so that CI shows one line that
    cannot be mistaken for a verdict; `--debug` / `PERFGUARD_DEBUG=1` prints it as well.
    """
    import tempfile
    import time
    import traceback

    text = "".join(traceback.format_exception(exc))
    where: str
    try:
        folder = os.environ.get(ENV_TRACEBACK_DIR) or tempfile.gettempdir()
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w",
            encoding="utf-8",
            dir=folder,
            prefix=f"perfguard-traceback-{time.strftime('%Y%m%dT%H%M%S')}-",
            suffix=".txt",
            delete=False,
        ) as fh:
            fh.write(f"perfguard {__version__}: {sys.argv!r}\n{text}")
        where = f"traceback in {fh.name}"
    except OSError as write_error:
        where = f"traceback not saved ({write_error.strerror or write_error}): rerun with --debug"
    reason = " ".join(str(exc).split())
    if len(reason) > 300:
        reason = reason[:300] + "..."
    if _debug():
        click.echo(text.rstrip("\n"), err=True)
    click.echo(
        f"perfguard: internal error (exit {EXIT_INTERNAL}, not a verdict): "
        f"{type(exc).__name__}: {reason or '(no message)'}; {where}",
        err=True,
    )


class _PipeGuard:
    """stdout that goes quiet once its reader has gone (`perfguard check ... | head`).

    A closed pipe is not a failure of the command: the check still finishes and its exit
    code (the verdict) stands. The first write that meets a closed pipe points the file
    descriptor at /dev/null, so every later write, and the interpreter's final flush,
    succeeds without a word.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _silence(self) -> None:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._silence()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._silence()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def run_main(argv: list[str] | None = None) -> None:
    """Entry point and the one exit path of every command.

    `PerfguardError` -> its one-line message and code (2 unless it says otherwise);
    Ctrl-C -> 130; SIGTERM -> 143 (the handler raises, so files stay whole); anything else
    (a bug, a library raising something unexpected) -> 70 with one line naming the error
    and where its traceback is. A crash is never exit 1, which CI reads as a regression.
    """
    import signal
    import threading

    _DEBUG[0] = False
    stdout = sys.stdout
    if not isinstance(stdout, _PipeGuard):
        sys.stdout = _PipeGuard(stdout)  # type: ignore[assignment]
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    code: int
    try:
        rv = cli.main(args=argv, prog_name="perfguard", standalone_mode=False)
        code = rv if isinstance(rv, int) else EXIT_OK
    except PerfguardError as exc:
        click.echo(f"perfguard: error: {exc}", err=True)
        code = exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("perfguard: interrupted", err=True)
        code = EXIT_INTERRUPTED
    except Terminated:
        click.echo("perfguard: terminated (SIGTERM)", err=True)
        code = EXIT_TERMINATED
    except click.ClickException as exc:
        exc.show()
        code = EXIT_USAGE if exc.exit_code == 2 else exc.exit_code
    except SystemExit:
        raise
    except BaseException as exc:  # the one place every other error ends
        _report_internal(exc)
        code = EXIT_INTERNAL
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if isinstance(sys.stdout, _PipeGuard):
            sys.stdout.flush()  # what is still buffered meets a closed pipe here, quietly
        sys.stdout = stdout
    sys.exit(code)
