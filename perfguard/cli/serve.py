"""`perfguard serve`: an HTTP server with sglang's endpoints over one pipeline
(`perfguard.measurement.serving.app`; docs/serving.md)."""

from __future__ import annotations

from typing import Any

import click

from perfguard import api
from perfguard.api.options import popped
from perfguard.api.serve import ServeSettings
from perfguard.cli.common import CONTEXT_SETTINGS, platform_option, value_options
from perfguard.errors import EXIT_CODES_HELP


def _settings_from(flags: dict[str, Any]) -> ServeSettings:
    names = ("model", "case_id", "cases_dir", "host", "port", "encode_delay_ms", "fail_every")
    more = ("perf_log_dir", "video_frames")
    return ServeSettings(**popped(flags, *names, *more, inject="inject_spec"))


_SERVE_OPTIONS = [
    click.option(
        "--model",
        default="qwen_image",
        show_default=True,
        help="The built-in pipeline to serve at the tiny preset: qwen_image or glm_image.",
    ),
    click.option(
        "--case",
        "case_id",
        default=None,
        help="Serve this registry case's pipeline instead (a built-in or diffusers case).",
    ),
    click.option(
        "--cases",
        "cases_dir",
        default=None,
        type=click.Path(file_okay=False),
        help="The case registry directory of --case (default: ./cases).",
    ),
    click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on."),
    click.option(
        "--port",
        default=30000,
        show_default=True,
        type=click.IntRange(1, 65535),
        help="Port to listen on.",
    ),
    click.option(
        "--inject",
        "inject_spec",
        default=None,
        help="Slow named stages with real work, e.g. 'DenoisingStage=+30%' (self-tests).",
    ),
    click.option(
        "--encode-delay-ms",
        default=0.0,
        type=click.FloatRange(min=0),
        help="Busy-wait this long after each pipeline call, outside every stage "
        "(a slower image encoding; self-tests).",
    ),
    click.option(
        "--fail-every",
        default=0,
        type=click.IntRange(min=0),
        help="Answer every Nth request with HTTP 500 (self-tests; 0: never).",
    ),
    click.option(
        "--perf-log-dir",
        default=None,
        envvar="SGLANG_PERF_LOG_DIR",
        help="Write sglang's performance.log lines here (env: SGLANG_PERF_LOG_DIR).",
    ),
    click.option(
        "--video-frames",
        default=4,
        show_default=True,
        type=click.IntRange(min=1),
        help="Frames of a /v1/videos job (the image pipeline runs once per frame).",
    ),
]
"""What `perfguard serve` serves and how: the command gets `settings` (`ServeSettings`)."""


@click.command("serve", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@platform_option
@value_options("settings", _settings_from, _SERVE_OPTIONS)
def serve_command(platform_name: str | None, settings: ServeSettings) -> None:
    """Serve one pipeline over HTTP with sglang's endpoints, one request at a time.

    /health, /v1/models, /v1/images/generations (b64_json PNGs), the /v1/videos job
    lifecycle, /metrics with sglang's metric names. Requests queue in front of one
    worker, so p99 grows with concurrency. Stops on Ctrl-C or SIGTERM.
    """
    api.serve(settings, platform=platform_name)
