"""`perfguard serve`: one pipeline served over HTTP with sglang's endpoints
(`perfguard.measurement.serving.app`; docs/serving.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from perfguard.api.common import probe
from perfguard.errors import PerfguardError


@dataclass(frozen=True)
class ServeSettings:
    """What `perfguard serve` serves and how it answers: the built-in `model`, or the
    registry case `case_id` (from `cases_dir`); where it listens; and the knobs that
    slow it for self-tests (`inject` spelled `STAGE=+N%`, `encode_delay_ms` outside every
    stage, `fail_every` Nth request a 500), sglang's performance.log directory and the
    frames of a video job."""

    model: str = "qwen_image"
    case_id: str | None = None
    cases_dir: str | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    inject: str | None = None
    encode_delay_ms: float = 0.0
    fail_every: int = 0
    perf_log_dir: str | None = None
    video_frames: int = 4


def serve(settings: ServeSettings, *, platform: str | None = None) -> None:
    """Build the served pipeline and serve it until Ctrl-C or SIGTERM; a server case
    cannot be served (it measures a server)."""
    from perfguard.device.inject import parse_inject
    from perfguard.measurement.serving import app
    from perfguard.storage.cases import load_registry, select

    chosen = probe(platform)
    case = None
    if settings.case_id is not None:
        case = select(load_registry(chosen.name, settings.cases_dir), [settings.case_id])[0]
    if case is not None and case.workload == "server":
        raise PerfguardError(
            f"--case {settings.case_id}: a server case measures a server; serve a pipeline"
        )
    served = app.served_case(settings.model, case)
    perf_log_dir = settings.perf_log_dir
    options = app.ServeOptions(
        model=served.id if case is not None else settings.model,
        inject=parse_inject(settings.inject),
        encode_delay_ms=settings.encode_delay_ms,
        fail_every=settings.fail_every,
        perf_log_dir=os.path.expanduser(perf_log_dir) if perf_log_dir else None,
        video_frames=settings.video_frames,
    )
    app.serve(app.build(served, chosen), chosen, options, host=settings.host, port=settings.port)
