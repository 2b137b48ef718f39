"""Server cases against real processes: `perfguard serve` on 127.0.0.1, driven by the
official OpenAI client as sglang's tests drive sglang, and gated by gen-baselines + check.

The servers start once per module, side by side (a plain one and three slowed ones), so
the whole file pays about one server's start; one baseline of the plain server serves
the three checks of the slowed ones. A `launch` case is tested against a stdlib server
that starts in milliseconds: what it pins is that every round gets a server of its own."""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from perfguard import api
from perfguard.decision.options import JudgeOptions
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.serving import scrape
from perfguard.measurement.serving.case import run_coroutine
from perfguard.measurement.serving.launch import Launched, LaunchFailed
from perfguard.measurement.serving.load import Client, run_level
from perfguard.presentation.html import render_report_html
from perfguard.presentation.markdown import render_markdown
from perfguard.storage.cases import Selection
from perfguard.storage.jsonio import validate

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

SERVE = [sys.executable, "-m", "perfguard", "serve", "--platform", "cpu", "--port", "{port}"]
SLOWED = {
    "plain": [],
    "denoise": ["--inject", "DenoisingStage=+300%"],
    "encode": ["--encode-delay-ms", "120"],
    "fail": ["--fail-every", "5"],
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Launched]]:
    logs = tmp_path_factory.mktemp("perf")
    started = {
        name: Launched([*SERVE, *extra, "--perf-log-dir", str(logs / name)], timeout_s=180)
        for name, extra in SLOWED.items()
    }
    try:
        for server in started.values():  # start them all, then wait: the starts overlap
            server.spawn()
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():  # stop them all, then reap: the stops overlap
            if server.proc is not None:
                server.proc.terminate()
        for server in started.values():
            server.stop()


def write_case(root: Path, url: str, **extra: object) -> Path:
    fields = {
        "id": "served",
        "workload": "server",
        "url": url,
        "concurrency": [1],
        "requests": 4,
        "warmup": 1,
        "rounds": 3,
        **extra,
    }
    lines = ["[[case]]"]
    for key, value in fields.items():
        if value != "":
            lines.append(f"{key} = {json.dumps(value)}")
    lines.append('request = {prompt = "a red fox", response_format = "b64_json"}')
    root.mkdir(parents=True, exist_ok=True)
    (root / "cpu.toml").write_text("\n".join(lines) + "\n")
    return root


OPTIONS = MeasureOptions(repeats=1, warmup=0)


@pytest.fixture(scope="module")
def plain_baseline(
    servers: dict[str, Launched], tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, list[str]]:
    """gen-baselines against the plain server, once for the module: its path and what
    gen-baselines said."""
    root = tmp_path_factory.mktemp("baseline")
    said: list[str] = []
    cases = write_case(root / "cases", servers["plain"].url)
    api.gen_baselines(Selection(cases_dir=str(cases)), OPTIONS, baseline=str(root / "b.json"),
                      platform="cpu", say=said.append)  # fmt: skip
    return str(root / "b.json"), said


@pytest.fixture
def check(
    servers: dict[str, Launched],
    plain_baseline: tuple[str, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[str], Any]:
    """A check of the named server against the plain server's baseline: the report."""
    monkeypatch.setenv("PERFGUARD_ATTRIBUTION", "0")

    def run(name: str) -> Any:
        cases = write_case(tmp_path / "cases", servers[name].url)
        return api.check(Selection(cases_dir=str(cases)), OPTIONS,
                         judging=JudgeOptions(max_reruns=2), baseline=plain_baseline[0],
                         platform="cpu")  # fmt: skip

    return run


def regressions(report: Any) -> set[str]:
    """The metrics a report calls slower, over all its cases."""
    return {m.metric for c in report.cases for m in c.metrics if m.verdict == "regression"}


def test_the_openai_client_drives_perfguard_serve(servers: dict[str, Launched]) -> None:
    url = servers["plain"].url
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["qwen_image"]
    image = client.images.generate(model="qwen_image", prompt="a fox", response_format="b64_json")
    assert base64.b64decode(image.data[0].b64_json).startswith(b"\x89PNG")
    extra = image.model_extra or {}
    assert "DenoisingStage" in extra["stage_durations"] and extra["inference_time_s"] > 0
    log = Path(servers["plain"].argv[-1]) / "performance.log"
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert extra["id"] in {x["request_id"] for x in lines}
    assert {"stages", "steps", "total_duration_ms"} <= set(lines[-1])
    metrics = httpx.get(f"{url}/metrics").text
    for name in ("request_latency", "queue_time", "stage_host_latency", "requests_total"):
        assert f"sglang:diffusion_{name}" in metrics
    job = httpx.post(f"{url}/v1/videos", json={"prompt": "a fox"}).json()
    while job["status"] not in ("completed", "failed"):
        time.sleep(0.05)
        job = httpx.get(f"{url}/v1/videos/{job['id']}").json()
    assert job["status"] == "completed"
    gif = httpx.get(f"{url}/v1/videos/{job['id']}/content")
    assert gif.content.startswith(b"GIF8")
    bad = httpx.post(f"{url}/v1/images/generations", json={"size": "64x64"})
    assert bad.status_code == 400 and "prompt" in bad.json()["error"]["message"]


def test_concurrency_queues_in_front_of_one_worker(servers: dict[str, Launched]) -> None:
    async def level(c: int) -> tuple[float, float, float]:
        client = Client(servers["plain"].url, "images", {"prompt": "a fox"}, 60)
        try:
            run = await run_level(client, c, 8, None, 0)
        finally:
            await client.close()
        lat = sorted(o.latency_ms for o in run.outcomes)
        return lat[len(lat) // 2], lat[-1], len(lat) / (run.wall_ms / 1e3)

    p50_1, _, tp_1 = run_coroutine(level(1))
    p50_4, p99_4, tp_4 = run_coroutine(level(4))
    assert p99_4 > p50_4 > 1.5 * p50_1, (p50_1, p50_4, p99_4)  # up to three ahead of each
    assert 0.4 < tp_4 / tp_1 < 2.5, (tp_1, tp_4)  # one worker: queueing adds no throughput


def test_gen_baselines_says_what_it_stored_for_a_server(
    plain_baseline: tuple[str, list[str]],
) -> None:
    (line,) = [x for x in plain_baseline[1] if x.startswith("served:")]
    assert "c1 p50 " in line and " ms" in line and "3 rounds on 1 server" in line, line
    assert "nothing timed" not in line


def test_check_names_the_denoising_stage_of_a_server_slowed_inside_it(
    check: Callable[[str], Any],
) -> None:
    report = check("denoise")
    assert report.exit_code == 1
    assert "stage:c1/DenoisingStage" in regressions(report)
    # The denoising stage moved, the decoding stage did not: their ratios differ by the
    # +300 %, whatever the busy test machine did to both since the baseline.
    ratio = ratios(report)
    assert ratio["stage:c1/DenoisingStage"] > 2 * ratio["stage:c1/DecodingStage"], ratio


def test_check_catches_a_server_slowed_outside_its_stages_on_latency(
    check: Callable[[str], Any],
) -> None:
    report = check("encode")
    assert report.exit_code == 1
    assert regressions(report) & {"stage:c1/latency_p50", "stage:c1/inv_throughput"}
    # The 120 ms are outside every stage: the latency grew, the stages did not (each
    # well under the latency's ratio, whatever the busy test machine did to both).
    ratio = ratios(report)
    stages = [r for m, r in ratio.items() if m.endswith("Stage")]
    assert stages and ratio["stage:c1/latency_p50"] > 1.5 * max(stages), ratio


def ratios(report: object) -> dict[str, float]:
    """Each c1 figure's measured / baseline median in a one-case report."""
    (case,) = report.cases  # type: ignore[attr-defined]
    return {
        m.metric: m.measured.median / m.baseline.median
        for m in case.metrics
        if m.metric.startswith("stage:c1/") and m.measured and m.baseline
    }


def test_failed_requests_the_baseline_did_not_have_fail_the_check_as_a_count(
    check: Callable[[str], Any],
) -> None:
    report = check("fail")
    assert report.exit_code == 1
    (case,) = report.cases
    (failures,) = [m for m in case.metrics if m.metric == "failures:c1"]
    # 3 rounds of 1 warm-up and 4 requests: requests 5, 10 and 15 of the server fail.
    assert failures.verdict == "regression" and failures.reason == "counted 3, baseline 0: +3"
    assert case.observed["server"]["levels"]["c1"]["answers"] == {"HTTP 500": 3, "ok": 9}
    markdown = render_markdown(report)
    assert "| level | p50 | p90 | p99 | req/s | failures |" in markdown
    assert "| c1 |" in markdown and "| 3 / 0 |" in markdown
    validate(report.to_json(), "report", "the report")
    assert "Latency against concurrency" in render_report_html(report)


def test_a_launch_case_runs_each_round_on_a_server_of_its_own(tmp_path: Path) -> None:
    from perfguard.measurement.serving.case import run_server_case
    from perfguard.storage.cases import load_registry

    pids = tmp_path / "pids"
    script = str(Path(__file__).with_name("tiny_http_server.py"))
    argv = [sys.executable, script, "{port}", str(pids)]
    cases = write_case(tmp_path / "cases", "", launch=argv)
    (case,) = load_registry("cpu", str(cases))
    result = run_server_case(case, OPTIONS, echo=lambda _m: None)
    assert result.status == "ok", result.error
    started = pids.read_text().split()
    assert len(started) == 3 and len(set(started)) == 3  # a server per round
    assert result.groups == [1, 1, 1] and result.observed["server"]["servers"] == 3
    for pid in started:  # each stopped once its round was measured
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


def test_an_unreachable_url_is_a_case_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perfguard.storage import baseline as store

    dead = f"http://127.0.0.1:{Launched(['x', '{port}']).port}"
    cases = write_case(tmp_path / "cases", dead)
    t0 = time.monotonic()
    update = api.gen_baselines(Selection(cases_dir=str(cases)), MeasureOptions(repeats=1),
                               baseline=str(tmp_path / "b.json"), platform="cpu",
                               say=lambda _m: None)  # fmt: skip
    result = update.results.cases["served"]
    assert result.status == "error" and dead in (result.error or "")
    assert time.monotonic() - t0 < 30 and update.failed
    assert (
        not (tmp_path / "b.json").exists()
        or "served" not in store.load(tmp_path / "b.json").scenarios
    )


def test_a_launch_that_never_gets_ready_says_its_last_lines(tmp_path: Path) -> None:
    script = "import time; print('loading weights', flush=True); time.sleep(60)"
    server = Launched([sys.executable, "-c", script, "{port}"], timeout_s=2)
    with pytest.raises(LaunchFailed, match="loading weights") as err:
        server.start()
    assert "not ready after 2 s" in str(err.value) and server.proc is None


def test_a_malformed_perf_log_line_is_counted_and_named(tmp_path: Path) -> None:
    path = tmp_path / "performance.log"
    good = {"request_id": "a", "stages": [{"name": "DenoisingStage", "execution_time_ms": 5}]}
    bad = {"request_id": "b", "stages": [{"name": "DenoisingStage", "execution_time_ms": "x"}]}
    path.write_text(f"{json.dumps(good)}\n{json.dumps(bad)}\nnot json\n")
    log = scrape.PerfLog(path)
    assert set(log.read_new()) == {"a"}
    assert len(log.problems) == 2 and "stages[0].execution_time_ms" in log.problems[0]
    problems: list[str] = []
    samples = scrape.parse_metrics("a_count 2\na_sum 0.5\nbroken{ x\n", problems)
    assert scrape.mean_ms({}, samples, "a") == 250.0 and len(problems) == 1
