"""`perfguard baselines ...`: inspect, compare, merge and import baseline files (no torch)."""

from __future__ import annotations

import click

from perfguard import api
from perfguard.api.options import PLATFORM_NAMES
from perfguard.cli.common import CONTEXT_SETTINGS, Decorator, console
from perfguard.errors import EXIT_CODES_HELP, EXIT_OK, PerfguardError
from perfguard.presentation.escape import rich_markup as escape
from perfguard.presentation.tables import baseline_diff_table, baseline_tables


@click.group("baselines", context_settings=CONTEXT_SETTINGS)
def baselines_group() -> None:
    """Inspect, compare, merge and import baseline files."""


@baselines_group.command("validate", context_settings=CONTEXT_SETTINGS)
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False))
def baselines_validate(paths: tuple[str, ...]) -> int:
    """Check each baseline file against the schema; exit 2 if any is invalid."""
    bad = 0
    for path in paths:
        try:
            b = api.read_baseline(path)
        except PerfguardError as exc:
            bad += 1
            click.echo(f"invalid: {exc}", err=True)
            continue
        console().print(
            escape(f"ok: {path} ({b.platform}/{b.hardware}, {len(b.scenarios)} scenario(s))")
        )
    if bad:
        raise PerfguardError(f"{bad} of {len(paths)} baseline file(s) are invalid")
    return EXIT_OK


@baselines_group.command("show", context_settings=CONTEXT_SETTINGS)
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--case", "case_id", default=None, help="Only this scenario.")
@click.option("--json", "as_json", is_flag=True, help="Print the (selected) JSON.")
def baselines_show(path: str, case_id: str | None, as_json: bool) -> int:
    """Print a baseline's metadata, tolerance profiles and scenarios."""
    b = api.read_baseline(path)
    if case_id is not None and case_id not in b.scenarios:
        raise PerfguardError(f"{path}: no scenario {case_id!r}")
    ids = [case_id] if case_id else sorted(b.scenarios)
    if as_json:
        click.echo(api.baseline_json(b, case_id), nl=False)
        return EXIT_OK
    out = console()
    meta = b.metadata
    out.print(
        escape(
            f"{path}: {b.platform}/{b.hardware}, updated {meta.get('updated')}, "
            f"git {str(meta.get('git_commit') or '-')[:12]}, {len(b.scenarios)} scenario(s)"
            + (" [advisory]" if meta.get("advisory") else "")
        )
    )
    for table in baseline_tables(b, ids):
        out.print(table)
    return EXIT_OK


@baselines_group.command("diff", context_settings=CONTEXT_SETTINGS)
@click.argument("a", type=click.Path(dir_okay=False))
@click.argument("b", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON (same as --format json).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "md", "json"]),
    default="table",
    show_default=True,
    help="md: the Markdown for a baseline pull request's description.",
)
def baselines_diff(a: str, b: str, as_json: bool, fmt: str) -> int:
    """Compare two baseline files: what moved from A (old) to B (new), and whether it matters.

    Per case and metric: old -> new median, the ratio with its 99 % interval from both
    sides' noise, and the change: slower / faster (credible and at least the metric's
    minimum effect), small (credible but below it), noise (the interval contains 1) or
    unknown (no spread on either side). Also scenarios added / removed and tolerances
    changed.
    """
    d = api.diff_baselines(a, b)
    if as_json or fmt == "json":
        click.echo(api.diff_json(d), nl=False)
        return EXIT_OK
    if fmt == "md":
        from perfguard.presentation.baseline_diff import render_baseline_diff_markdown

        click.echo(render_baseline_diff_markdown(d, a, b), nl=False)
        return EXIT_OK
    out = console()
    if d.empty:
        out.print("no difference in scenarios, figures or tolerances")
        return EXIT_OK
    for label, ids in (("added", d.added), ("removed", d.removed)):
        if ids:
            out.print(escape(f"{label}: {', '.join(ids)}"))
    if d.tolerance_changes:
        out.print(escape(f"tolerances changed: {', '.join(d.tolerance_changes)}"))
    if d.changed:
        out.print(baseline_diff_table(d, a, b))
        counts = d.counts()
        out.print(
            f"{counts['slower']} slower, {counts['faster']} faster (credible, at least the "
            f"minimum effect); {counts['small']} small, {counts['noise']} within noise, "
            f"{counts['unknown']} without a known spread"
        )
    return EXIT_OK


def _out_option(help: str, *dest: str) -> Decorator:
    """`--out FILE` (required): the baseline a command writes."""
    return click.option("--out", *dest, required=True, type=click.Path(dir_okay=False), help=help)


@baselines_group.command("merge", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False))
@_out_option("The merged baseline (may be one of the inputs; written atomically under its lock).")
@click.option(
    "--prefer",
    type=click.Choice(["newest", "first"]),
    default=None,
    help="Resolve a case held with different figures: newest keeps the scenario updated "
    "last, first the first input's (default: such a conflict is an error).",
)
def baselines_merge(paths: tuple[str, ...], out: str, prefer: str | None) -> int:
    """Merge baseline files (e.g. the shards of `gen-baselines --shard K/N`) into one.

    Scenarios are deduplicated by case id; identical ones collapse to one. A case held
    with different figures is an error naming both files, the case and the first metric
    that differs, unless --prefer resolves it; the merged file records which input each
    such scenario came from (`source`). The inputs must share platform, hardware, thread
    policy, tolerance profiles and schema version (else exit 2 naming the field). Every
    input's notes and tolerance_overrides are kept; overrides that conflict are an error.
    """
    result = api.merge_baselines(paths, out, prefer)
    b = result.baseline
    # Plain lines, not a rich console: paths are long and must not wrap mid-name in a log.
    click.echo(
        f"{out}: {len(b.scenarios)} scenario(s) from {len(result.inputs)} file(s) "
        f"({b.platform}/{b.hardware}); {len(result.collapsed)} identical in several "
        f"inputs, {len(result.conflicts)} conflict(s) resolved"
        + (f" with --prefer {prefer}" if result.conflicts else "")
    )
    for c in result.conflicts:
        click.echo(
            f"  {c.case_id}: kept {c.kept}, not {', '.join(c.dropped)} (first in {c.metric})"
        )
    return EXIT_OK


@baselines_group.command("import-sglang", context_settings=CONTEXT_SETTINGS)
@click.argument("src", type=click.Path(dir_okay=False))
@_out_option("The perfguard baseline to write.", "dst")
@click.option(
    "--platform",
    "platform_name",
    type=click.Choice(PLATFORM_NAMES),
    default=None,
    help="Platform of the figures (default: guessed from the file: npu, rocm, cuda).",
)
@click.option(
    "--hardware", default=None, help="Hardware slug (default: from the file's metadata.hardware)."
)
def baselines_import_sglang(
    src: str, dst: str, platform_name: str | None, hardware: str | None
) -> int:
    """Convert an sglang perf_baselines.json into a perfguard baseline, keeping every figure.

    Fields with no perfguard equivalent are kept verbatim under `sglang_extra`.
    """
    b = api.import_sglang(src, dst, platform_name, hardware)
    console().print(
        escape(
            f"{dst}: {len(b.scenarios)} scenario(s) imported from {src} ({b.platform}/{b.hardware})"
        )
    )
    return EXIT_OK
