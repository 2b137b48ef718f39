"""`perfguard env` and `perfguard list-cases`: what this machine is and what it would run."""

from __future__ import annotations

import json

import click

from perfguard import api
from perfguard.api.options import Selection
from perfguard.cli.common import (
    CONTEXT_SETTINGS,
    console,
    echo_err,
    file_option,
    platform_option,
    selection_options,
)
from perfguard.presentation.escape import rich_markup as escape
from perfguard.presentation.tables import cases_table, environment_table


@click.command(context_settings=CONTEXT_SETTINGS)
@platform_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def env(platform_name: str | None, as_json: bool) -> None:
    """Print the environment fingerprint stored with baselines and reports."""
    fp = api.environment(platform_name, availability=as_json)
    if as_json:
        click.echo(json.dumps(fp, indent=2, sort_keys=True))
        return
    console().print(environment_table(fp))


@click.command("list-cases", context_settings=CONTEXT_SETTINGS)
@platform_option
@selection_options()
@file_option(
    "--baseline",
    "baseline_path",
    help="With --shard: the baseline whose e2e times cases without estimated_time_s "
    "(default: baselines/<platform>/<hardware-slug>.json, as check uses).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of case objects.")
def list_cases(
    platform_name: str | None, selection: Selection, baseline_path: str | None, as_json: bool
) -> None:
    """List the cases selected for this platform, with the file each came from."""
    platform = api.probe(platform_name)
    cases = api.listed_cases(selection, platform, baseline=baseline_path, echo=echo_err)
    if as_json:
        listed = api.case_entries(cases, platform)
        click.echo(json.dumps(listed, indent=2, sort_keys=True))
        return
    console().print(cases_table(cases, platform.name))
    read, other_platforms = api.registry_files(selection.cases_dir, platform.name)
    console().print(escape(f"read: {', '.join(read)}"))
    if other_platforms:
        console().print(escape(f"for other platforms: {', '.join(other_platforms)}"))
