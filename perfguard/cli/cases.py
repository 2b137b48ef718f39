"""`perfguard env` and `perfguard list-cases`: what this machine is and what it would run."""

from __future__ import annotations

import json

import click

from perfguard import api
from perfguard.cli.common import (
    CONTEXT_SETTINGS,
    console,
    echo_err,
    platform_option,
    selection_options,
)
from perfguard.presentation.escape import rich_markup as escape
from perfguard.presentation.tables import cases_table, environment_table
from perfguard.storage.cases import Selection


@click.command(context_settings=CONTEXT_SETTINGS)
@platform_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def env(platform_name: str | None, as_json: bool) -> None:
    """Print the environment fingerprint stored with baselines and reports."""
    from perfguard.device.platform import availability, fingerprint

    fp = fingerprint(api.probe(platform_name))
    if as_json:
        fp["availability"] = {
            n: {"available": a.available, "reason": a.reason} for n, a in availability().items()
        }
        click.echo(json.dumps(fp, indent=2, sort_keys=True))
        return
    console().print(environment_table(fp))


@click.command("list-cases", context_settings=CONTEXT_SETTINGS)
@platform_option
@selection_options()
@click.option(
    "--baseline",
    "baseline_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="With --shard: the baseline whose e2e times cases without estimated_time_s "
    "(default: baselines/<platform>/<hardware-slug>.json, as check uses).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of case objects.")
def list_cases(
    platform_name: str | None, selection: Selection, baseline_path: str | None, as_json: bool
) -> None:
    """List the cases selected for this platform, with the file each came from."""
    from perfguard.storage.cases import display_path, load_registry, registry_root, scan_registry

    platform = api.probe(platform_name)
    cases = selection.of(load_registry(platform.name, selection.cases_dir))
    if selection.shard:
        path = api.baseline_path(baseline_path, platform.name, platform.hardware_slug())
        cases = api.shard(cases, selection.shard, path, echo=echo_err)
    if as_json:
        from perfguard.measurement.runner import planned_components

        listed = []
        for c in cases:
            components, note = planned_components(c, platform)
            entry = {**c.to_json(), "components": components}
            if note:
                entry["components_note"] = note
            listed.append(entry)
        click.echo(json.dumps(listed, indent=2, sort_keys=True))
        return
    console().print(cases_table(cases, platform.name))
    files = scan_registry(registry_root(selection.cases_dir), platform.name)
    console().print(escape(f"read: {', '.join(display_path(p) for p in files.read)}"))
    if files.other_platforms:
        others = ", ".join(display_path(p) for p in files.other_platforms)
        console().print(escape(f"for other platforms: {others}"))
