"""`perfguard serve`: a real HTTP server over one pipeline, with sglang's endpoints.

What it is for: the default server of a server case (docs/serving.md) and the proof that
the gate catches what a server's users feel. It serves one built-in pipeline (Qwen-Image
or GLM-Image at the `tiny` preset) or any case of the registry (a `diffusers` case too):

| endpoint                          | what                                                 |
|-----------------------------------|------------------------------------------------------|
| `GET /health`                     | 200 once the pipeline is built and warmed up         |
| `GET /v1/models`                  | the one model                                        |
| `POST /v1/images/generations`     | `b64_json` PNGs, with `stage_durations` (ms),        |
|                                   | `inference_time_s`, `queue_time_s`, `peak_memory_mb` |
| `POST /v1/videos`, `GET /v1/videos/{id}` | the job: queued, completed or failed          |
| `GET /v1/videos/{id}/content`     | a completed job's frames, as an animated GIF         |
| `GET /metrics`                    | Prometheus text with sglang's metric names           |

Why one worker thread behind a FIFO: a diffusion server runs one request at a time per
device (sglang's scheduler does), so concurrency queues, and p99 grows with load while
throughput stays at one pipeline's. The HTTP side is asyncio (uvicorn), so accepting,
polling and encoding replies never wait on the pipeline.

Why FastAPI with uvicorn: it is what sglang's and vLLM's OpenAI-compatible servers run,
so the client sees the same HTTP stack, and the OpenAI client drives it unchanged.

There is no built-in video pipeline: a video job runs the image pipeline once per frame
(`video_frames`) and its stages are the sums over the frames.

The knobs that slow it, each a kind of slowdown the gate must catch (docs/serving.md):
`inject` slows named stages with real busy work (`perfguard.device.inject`, as `check
--inject`), `encode_delay_ms` busy-waits after the pipeline, outside every stage (image
encoding made slower), and `fail_every` answers every Nth request with a 500.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as _dt
import io
import itertools
import json
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from perfguard.device.timer import StageTimer
from perfguard.errors import PerfguardError
from perfguard.measurement.serving import WARMUP_HEADER

try:  # the `serve` extra; FastAPI resolves the handlers' annotations in this module
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse, Response
except ImportError:  # pragma: no cover - reported by `create_app`
    FastAPI = None  # type: ignore[assignment,misc]

PERF_LOG_NAME = "performance.log"
"""sglang writes `$SGLANG_PERF_LOG_DIR/performance.log`; so does `perfguard serve`."""
INF = '"+Inf"'
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class ServeOptions:
    """How `perfguard serve` answers (see the module doc for the slowing knobs)."""

    model: str = "perfguard"
    inject: Mapping[str, float] = field(default_factory=dict)
    encode_delay_ms: float = 0.0
    fail_every: int = 0
    perf_log_dir: str | None = None
    video_frames: int = 4


class Failure(Exception):
    """A request the worker answers with an HTTP error: `status` and one line."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Answer:
    """What the worker made of one request."""

    request_id: str
    frames: list[bytes]
    stages_ms: dict[str, float]
    steps_ms: list[float]
    inference_ms: float
    queue_ms: float
    total_ms: float
    peak_memory_mb: float | None = None


# ---- Prometheus text, sglang's names ---------------------------------------------------------


class Metrics:
    """Histograms and counters in Prometheus' text format, named as sglang's
    `--enable-metrics` names them; no client library, the format is a few lines."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hist: dict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = {}
        self._count: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            cells = self._hist.setdefault(key, [0.0] * (len(BUCKETS_S) + 2))
            for i, edge in enumerate(BUCKETS_S):
                if seconds <= edge:
                    cells[i] += 1
            cells[-2] += 1  # count (+Inf)
            cells[-1] += seconds  # sum

    def inc(self, name: str, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._count[key] = self._count.get(key, 0.0) + 1

    def render(self) -> str:
        def fmt(labels: tuple[tuple[str, str], ...], extra: str = "") -> str:
            parts = [f'{k}="{v}"' for k, v in labels] + ([extra] if extra else [])
            return "{" + ",".join(parts) + "}" if parts else ""

        lines: list[str] = []
        with self._lock:
            for name in sorted({n for n, _ in self._hist}):
                lines.append(f"# TYPE {name} histogram")
                for (n, labels), cells in sorted(self._hist.items()):
                    if n != name:
                        continue
                    for edge, c in zip(BUCKETS_S, cells, strict=False):
                        lines.append(
                            f"{name}_bucket{fmt(labels, f'le={chr(34)}{edge}{chr(34)}')} {c:g}"
                        )
                    lines.append(f"{name}_bucket{fmt(labels, 'le=' + INF)} {cells[-2]:g}")
                    lines.append(f"{name}_count{fmt(labels)} {cells[-2]:g}")
                    lines.append(f"{name}_sum{fmt(labels)} {cells[-1]:.6f}")
            for name in sorted({n for n, _ in self._count}):
                lines.append(f"# TYPE {name} counter")
                for (n, labels), value in sorted(self._count.items()):
                    if n == name:
                        lines.append(f"{name}{fmt(labels)} {value:g}")
        return "\n".join(lines) + "\n"


# ---- the worker ------------------------------------------------------------------------------


def png_frames(output: torch.Tensor) -> list[bytes]:
    """The pipeline's images ([B, 3, H, W] in [0, 1]) as PNG files, one per row."""
    from PIL import Image

    pixels = (output.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()
    out = []
    for row in pixels.reshape(-1, *pixels.shape[-3:]):
        buf = io.BytesIO()
        Image.fromarray(row.permute(1, 2, 0).numpy()).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def busy_wait(ms: float) -> None:
    """Spend `ms` of CPU on this thread: real work, as `--inject` spends inside stages."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


class Worker:
    """One pipeline on one device, run by one thread from a FIFO of requests."""

    def __init__(
        self,
        pipeline: Callable[[], torch.Tensor],
        platform: Any,
        options: ServeOptions,
        metrics: Metrics,
    ) -> None:
        self.pipeline, self.platform, self.options, self.metrics = (
            pipeline,
            platform,
            options,
            metrics,
        )
        self._queue: queue.Queue[tuple[str, int, float, bool, Future[Answer]] | None] = (
            queue.Queue()
        )
        self._numbers = itertools.count(1)
        self._log = None
        if options.perf_log_dir:
            Path(options.perf_log_dir).mkdir(parents=True, exist_ok=True)
            self._log = open(Path(options.perf_log_dir) / PERF_LOG_NAME, "a", encoding="utf-8")  # noqa: SIM115
        self._thread = threading.Thread(target=self._loop, name="pipeline-worker", daemon=True)
        self._thread.start()

    def submit(self, frames: int = 1, *, warmup: bool = False) -> Future[Answer]:
        """Queue one request of `frames` pipeline calls; its future holds the answer."""
        fut: Future[Answer] = Future()
        rid = uuid.uuid4().hex
        self._queue.put((rid, frames, time.perf_counter(), warmup, fut))
        return fut

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)
        if self._log is not None:
            self._log.close()

    def _loop(self) -> None:
        while (job := self._queue.get()) is not None:
            rid, frames, queued, warmup, fut = job
            started = time.perf_counter()
            try:
                answer = self._run(rid, frames, queued, started)
            except Failure as exc:
                self._count(False, warmup)
                fut.set_exception(exc)
            except Exception as exc:  # the pipeline failed: the client gets a 500
                self._count(False, warmup)
                fut.set_exception(Failure(500, f"{type(exc).__name__}: {exc}".splitlines()[0]))
            else:
                self._count(True, warmup)
                self._record(answer)
                fut.set_result(answer)

    def _count(self, ok: bool, warmup: bool) -> None:
        self.metrics.inc(
            "sglang:diffusion_requests_total",
            status="success" if ok else "failed",
            is_warmup=str(warmup).lower(),
        )

    def _run(self, rid: str, frames: int, queued: float, started: float) -> Answer:
        number = next(self._numbers)
        every = self.options.fail_every
        if every and number % every == 0:
            raise Failure(500, f"injected failure: request {number} (every {every}th answers 500)")
        stages: dict[str, float] = {}
        steps: list[float] = []
        images: list[bytes] = []
        inference = 0.0
        self.platform.reset_peak_memory()
        for _ in range(frames):
            with StageTimer(self.platform, inject=self.options.inject) as timer:
                output = self.pipeline()
            record = timer.record()
            inference += record.e2e_ms
            for name, ms in record.stages_ms.items():
                stages[name] = stages.get(name, 0.0) + ms
            steps.extend(record.steps_ms)
            # Outside every stage: what a slower image encoder costs a request.
            busy_wait(self.options.encode_delay_ms)
            images.extend(png_frames(output))
        peak = self.platform.peak_memory_bytes()
        done = time.perf_counter()
        return Answer(
            request_id=rid,
            frames=images,
            stages_ms=stages,
            steps_ms=steps,
            inference_ms=inference,
            queue_ms=(started - queued) * 1e3,
            total_ms=(done - started) * 1e3,
            peak_memory_mb=None if peak is None else peak / 2**20,
        )

    def _record(self, answer: Answer) -> None:
        """The answer's metrics and, when asked, its `performance.log` line (sglang's)."""
        m = self.metrics
        m.observe("sglang:diffusion_request_latency_seconds", answer.total_ms / 1e3)
        m.observe("sglang:diffusion_queue_time_seconds", answer.queue_ms / 1e3)
        for name, ms in answer.stages_ms.items():
            m.observe("sglang:diffusion_stage_host_latency_seconds", ms / 1e3, stage=name)
        if self._log is None:
            return
        line = {
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(),
            "request_id": answer.request_id,
            "tag": self.options.model,
            "stages": [{"name": n, "execution_time_ms": ms} for n, ms in answer.stages_ms.items()],
            "steps": answer.steps_ms,
            "total_duration_ms": answer.total_ms,
        }
        self._log.write(json.dumps(line) + "\n")
        self._log.flush()


# ---- the HTTP side ---------------------------------------------------------------------------


def _error(status: int, message: str) -> Any:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)


async def _body(request: Any) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise Failure(400, f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise Failure(400, "the body is not a JSON object")
    if not isinstance(body.get("prompt"), str) or not body["prompt"]:
        raise Failure(400, "prompt: required (a non-empty string)")
    fmt = body.get("response_format", "b64_json")
    if fmt not in (None, "b64_json"):
        raise Failure(400, f"response_format: {fmt!r} is not supported (b64_json only)")
    return body


def _figures(answer: Answer) -> dict[str, Any]:
    out: dict[str, Any] = {
        "stage_durations": {k: round(v, 4) for k, v in answer.stages_ms.items()},
        "inference_time_s": round(answer.inference_ms / 1e3, 6),
        "queue_time_s": round(answer.queue_ms / 1e3, 6),
    }
    if answer.peak_memory_mb is not None:
        out["peak_memory_mb"] = round(answer.peak_memory_mb, 3)
    return out


def create_app(worker: Worker, options: ServeOptions) -> Any:
    """The FastAPI application over `worker`."""
    if FastAPI is None:
        raise PerfguardError("perfguard serve needs FastAPI: pip install 'perfguard[serve]'")
    app = FastAPI(title="perfguard serve")
    _add_info_routes(app, worker, options)
    _add_image_routes(app, worker)
    _add_video_routes(app, worker, options)
    return app


def _add_info_routes(app: Any, worker: Worker, options: ServeOptions) -> None:
    """`/health`, `/v1/models` and the Prometheus `/metrics`."""

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": options.model, "object": "model", "created": 0, "owned_by": "perfguard"}
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def metrics() -> Any:
        return PlainTextResponse(worker.metrics.render())


def _add_image_routes(app: Any, worker: Worker) -> None:
    """`/v1/images/generations`: one image, answered when it is made."""

    @app.post("/v1/images/generations")
    async def generations(request: Request) -> Any:
        try:
            await _body(request)
            warm = request.headers.get(WARMUP_HEADER) == "1"
            answer = await asyncio.wrap_future(worker.submit(warmup=warm))
        except Failure as exc:
            return _error(exc.status, str(exc))
        data = [{"b64_json": base64.b64encode(png).decode("ascii")} for png in answer.frames]
        return {
            "id": answer.request_id,
            "created": int(time.time()),
            "data": data,
            **_figures(answer),
        }


def _add_video_routes(app: Any, worker: Worker, options: ServeOptions) -> None:
    """`/v1/videos`: a job answered at once, polled, and its frames fetched as a GIF."""
    jobs: dict[str, dict[str, Any]] = {}

    @app.post("/v1/videos")
    async def videos(request: Request) -> Any:
        try:
            await _body(request)
        except Failure as exc:
            return _error(exc.status, str(exc))
        warm = request.headers.get(WARMUP_HEADER) == "1"
        fut = worker.submit(options.video_frames, warmup=warm)
        vid = f"video_{uuid.uuid4().hex}"
        job: dict[str, Any] = {"id": vid, "object": "video", "model": options.model}
        job.update(status="queued", progress=0, created_at=int(time.time()))
        jobs[vid] = job
        fut.add_done_callback(lambda f: _finish(job, f))
        return dict(job)

    @app.get("/v1/videos/{vid}")
    async def video(vid: str) -> Any:
        job = jobs.get(vid)
        if job is None:
            return _error(404, f"no video job {vid}")
        return {k: v for k, v in job.items() if k != "_frames"}

    @app.get("/v1/videos/{vid}/content")
    async def content(vid: str) -> Any:
        job = jobs.get(vid)
        if job is None or job["status"] != "completed":
            return _error(404, f"no completed video job {vid}")
        return Response(_gif(job["_frames"]), media_type="image/gif")


def _finish(job: dict[str, Any], fut: Future[Answer]) -> None:
    """A video job's state once its frames are made (or not)."""
    exc = fut.exception()
    if exc is not None:
        job.update(
            status="failed", error={"message": str(exc), "code": getattr(exc, "status", 500)}
        )
        return
    answer = fut.result()
    job.update(status="completed", progress=100, request_id=answer.request_id)
    job.update(completed_at=int(time.time()), _frames=answer.frames, **_figures(answer))


def _gif(frames: list[bytes]) -> bytes:
    from PIL import Image

    images = [Image.open(io.BytesIO(f)).convert("RGB") for f in frames]
    buf = io.BytesIO()
    images[0].save(buf, format="GIF", save_all=True, append_images=images[1:], duration=100)
    return buf.getvalue()


def serve(
    pipeline: Callable[[], torch.Tensor],
    platform: Any,
    options: ServeOptions,
    *,
    host: str = "127.0.0.1",
    port: int = 30000,
) -> None:
    """Warm the pipeline up, then serve it until SIGINT / SIGTERM (uvicorn's handlers).

    The warm-up call pays the one-off costs (allocator growth, lazy initialisation) before
    `/health` answers, so that the first measured request is a request like the others.
    """
    pipeline()
    worker = Worker(pipeline, platform, options, Metrics())
    try:
        uvicorn.run(create_app(worker, options), host=host, port=port, log_level="info")
    finally:
        with contextlib.suppress(Exception):
            worker.close()


SERVED_MODELS = {
    "qwen_image": {"guidance_scale": 4.0},
    "glm_image": {"guidance_scale": 1.5, "options": {"prior_tokens": 8}},
}
"""The built-in pipelines `perfguard serve --model` serves, at the `tiny` preset."""


def served_case(model: str, case: Any = None) -> Any:
    """The case whose pipeline is served: `case` (a registry case) as it is, else the
    built-in `model` at the `tiny` preset, one 64x64 image, 4 steps (the smoke cases'
    sizes, one row: a server answers one prompt)."""
    from perfguard.storage.cases import Case

    if case is not None:
        return case
    if model not in SERVED_MODELS:
        raise PerfguardError(f"--model {model!r}: choose from {', '.join(SERVED_MODELS)}")
    extra = SERVED_MODELS[model]
    return Case(id=f"serve_{model}", workload=model, preset="tiny", height=64, width=64,
                steps=4, batch=1, prompt_lengths=(24,), **extra)  # fmt: skip


def build(case: Any, platform: Any) -> Callable[[], torch.Tensor]:
    """The case's pipeline at its thread count (`perfguard.device.threads`), as the runner
    builds it for a measurement."""
    from perfguard.device import threads
    from perfguard.storage.cases import DIFFUSERS

    threads.apply(threads.case_threads(case, platform.name, None))
    if case.workload == DIFFUSERS:
        from perfguard.interop.diffusers import build_diffusers_pipeline

        return build_diffusers_pipeline(case, platform)
    from perfguard.workloads.registry import build_pipeline

    return build_pipeline(case, platform)
