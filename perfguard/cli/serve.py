"""`perfguard serve`: an HTTP server with sglang's endpoints over one pipeline
(`perfguard.measurement.serving.app`; docs/serving.md)."""

from __future__ import annotations

import os

import click

from perfguard.cli.common import CONTEXT_SETTINGS, platform_option
from perfguard.errors import EXIT_CODES_HELP, PerfguardError


@click.command("serve", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@platform_option
@click.option(
    "--model",
    default="qwen_image",
    show_default=True,
    help="The built-in pipeline to serve at the tiny preset: qwen_image or glm_image.",
)
@click.option(
    "--case",
    "case_id",
    default=None,
    help="Serve this registry case's pipeline instead (a built-in or diffusers case).",
)
@click.option(
    "--cases",
    "cases_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="The case registry directory of --case (default: ./cases).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    default=30000,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="Port to listen on.",
)
@click.option(
    "--inject",
    "inject_spec",
    default=None,
    help="Slow named stages with real work, e.g. 'DenoisingStage=+30%' (self-tests).",
)
@click.option(
    "--encode-delay-ms",
    default=0.0,
    type=click.FloatRange(min=0),
    help="Busy-wait this long after each pipeline call, outside every stage "
    "(a slower image encoding; self-tests).",
)
@click.option(
    "--fail-every",
    default=0,
    type=click.IntRange(min=0),
    help="Answer every Nth request with HTTP 500 (self-tests; 0: never).",
)
@click.option(
    "--perf-log-dir",
    default=None,
    envvar="SGLANG_PERF_LOG_DIR",
    help="Write sglang's performance.log lines here (env: SGLANG_PERF_LOG_DIR).",
)
@click.option(
    "--video-frames",
    default=4,
    show_default=True,
    type=click.IntRange(min=1),
    help="Frames of a /v1/videos job (the image pipeline runs once per frame).",
)
def serve_command(
    platform_name: str | None,
    model: str,
    case_id: str | None,
    cases_dir: str | None,
    host: str,
    port: int,
    inject_spec: str | None,
    encode_delay_ms: float,
    fail_every: int,
    perf_log_dir: str | None,
    video_frames: int,
) -> None:
    """Serve one pipeline over HTTP with sglang's endpoints, one request at a time.

    /health, /v1/models, /v1/images/generations (b64_json PNGs), the /v1/videos job
    lifecycle, /metrics with sglang's metric names. Requests queue in front of one
    worker, so p99 grows with concurrency. Stops on Ctrl-C or SIGTERM.
    Over the house limits because each keyword is one of the command's flags.
    """
    from perfguard.device.inject import parse_inject
    from perfguard.device.platform import probe
    from perfguard.measurement.serving import app
    from perfguard.storage.cases import load_registry, select

    platform = probe(platform_name)
    case = None
    if case_id is not None:
        case = select(load_registry(platform.name, cases_dir), [case_id])[0]
    if case is not None and case.workload == "server":
        raise PerfguardError(f"--case {case_id}: a server case measures a server; serve a pipeline")
    served = app.served_case(model, case)
    options = app.ServeOptions(
        model=served.id if case is not None else model,
        inject=parse_inject(inject_spec),
        encode_delay_ms=encode_delay_ms,
        fail_every=fail_every,
        perf_log_dir=os.path.expanduser(perf_log_dir) if perf_log_dir else None,
        video_frames=video_frames,
    )
    app.serve(app.build(served, platform), platform, options, host=host, port=port)
