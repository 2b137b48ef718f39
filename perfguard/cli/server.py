"""`perfguard server status|stop`: the resident server measuring commands fork from.

The server (`perfguard.measurement.resident`) starts with the first measuring command
and leaves after `$PERFGUARD_SERVER_IDLE_S` seconds without one (default 600; 0: no
server, every command imports its own modules). These commands show and end it.
"""

from __future__ import annotations

import json
import time

import click

from perfguard import api
from perfguard.cli.common import CONTEXT_SETTINGS, console


@click.group("server", context_settings=CONTEXT_SETTINGS)
def server_group() -> None:
    """The resident server that measuring commands fork from (it keeps torch,
    transformers and diffusers imported between commands)."""


@server_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status_command(as_json: bool) -> None:
    """List this user's resident servers: pid, age, idle limit, imports, processes forked."""
    found = api.servers()
    if as_json:
        click.echo(json.dumps(found, indent=2, sort_keys=True))
        return
    if not found:
        click.echo("no resident server (the next measuring command starts one)")
        return
    from rich.table import Table

    table = Table("key", "pid", "age", "idle limit", "imports", "forked", "state", "perfguard")
    now = time.time()
    for s in found:
        state = "stale: " + s["stale"] if s["stale"] else ("ready" if s["answers"] else "gone")
        table.add_row(
            str(s["key"]), str(s["pid"]), f"{now - float(s['started_at'] or now):.0f} s",
            f"{s['idle_s']:g} s", f"{s['import_s']:.2f} s", str(s["served"] or 0), state,
            str(s["root"]),
        )  # fmt: skip
    console().print(table)


@server_group.command("stop")
def stop_command() -> None:
    """Stop this user's resident servers (a command they are running is killed)."""
    click.echo(f"stopped {api.stop_all()} resident server(s)")
