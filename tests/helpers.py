"""Builders the test modules share: real reports, sglang request records, noisy samples.

Each is built by the library itself (a report is judged and written by perfguard, not
typed in), so a test that reads one tests what users get. Fixtures live in conftest.py;
the virtual-clock fake pipelines in fake_pipeline.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from perfguard.decision.stats import Summary
from perfguard.decision.tolerances import default_profiles
from perfguard.decision.verdict import judge
from perfguard.device.platform import Platform
from perfguard.results import CaseResult, Results
from perfguard.storage import reports as rep
from perfguard.storage.baseline import Baseline, Scenario, new_baseline
from perfguard.storage.refresh import scenario_from_result
from perfguard.storage.reports import build, write_report

PG = Callable[..., tuple[int, str, str]]
"""The `pg` fixture (conftest): `perfguard ARGS` in process -> (exit code, stdout, stderr)."""

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "sglang"  # sglang's own files
H100 = FIXTURES / "h100_excerpt.json"
NPU = FIXTURES / "perf_baselines_npu.json"

GLM_LAT_H, GLM_LAT_W, GLM_GLYPH_LEN, GLM_BATCH = 8, 12, 5, 2

ENV = {"platform": "cpu", "hardware": "test-cpu", "git_commit": None}


def noisy(median: float, rel_sd: float, n: int, seed: int) -> list[float]:
    """`n` log-normal samples around `median` with a relative spread of `rel_sd`."""
    rng = random.Random(seed)
    return [median * math.exp(rng.gauss(0.0, rel_sd)) for _ in range(n)]


def diffusers_fields(
    case_id: str, model: Path, steps: int, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A diffusers case's fields: `model` at 32x32 for `steps` steps with a prompt and a
    negative prompt, then `extra` (which may replace any of them)."""
    return {
        "id": case_id,
        "workload": "diffusers",
        "model": str(model),
        "prompt": "a red fox in the snow",
        "negative_prompt": "blurry",
        "height": 32,
        "width": 32,
        "steps": steps,
        **(extra or {}),
    }


def measured(
    case_id: str,
    samples: dict[str, list[float]],
    *,
    load_ms: float = 12.0,
    case: dict[str, Any] | None = None,
) -> CaseResult:
    """A successful result of `case_id`: 3 runs of `samples` after 1 warm-up, a
    deterministic output "abc", its case definition `{"id": case_id, **case}`."""
    return CaseResult(
        case_id=case_id,
        samples=samples,
        output_hash="abc",
        deterministic=True,
        load_ms=load_ms,
        warmup=1,
        repeats=3,
        case={"id": case_id, **(case or {})},
    )


def run_counting(
    build: Callable[[], Callable[[], Any]], platform: Any, options: Any, case_id: str
) -> tuple[CaseResult, int]:
    """`run_case` of a tiny case `case_id` whose pipeline is `build()`'s: the result, and
    how many times the runner called the pipeline."""
    from perfguard.measurement.runner import run_case
    from perfguard.storage.cases import Case

    calls: list[None] = []

    def factory(case: Any, platform: Any) -> Callable[[], Any]:
        run = build()

        def counted() -> Any:
            calls.append(None)
            return run()

        return counted

    case = Case(id=case_id, workload="qwen_image", preset="tiny")
    return run_case(case, platform, options, factory=factory), len(calls)


class HostAllocator(Platform):
    """A device's allocator counted on the host: `allocate` and `release` move the bytes
    held, the peak follows, and the platform reports per-stage peaks as a device does."""

    def __init__(self, **platform: Any) -> None:
        super().__init__(**platform)
        self.allocated = 0
        self.peak = 0

    @property
    def stage_memory(self) -> bool:
        return True

    def reset_peak_memory(self) -> None:
        self.peak = self.allocated

    def peak_memory_bytes(self) -> int:
        return self.peak

    def allocate(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)

    def release(self, nbytes: int) -> None:
        self.allocated -= nbytes


def history_report(path: Path, denoise_ms: float, seed: int, baseline_ms: float = 20.0) -> Path:
    """A real report made by the library from samples around `denoise_ms`."""
    rng = np.random.default_rng(seed)
    return judged_report(path, noisy_result(rng, baseline_ms), noisy_result(rng, denoise_ms))


def noisy_result(
    rng: np.random.Generator, denoise_ms: float, noisy_decoding: bool = False
) -> CaseResult:
    """5 runs of qwen_image_t2i_smoke: DenoisingStage around `denoise_ms` (1 % noise),
    DecodingStage about 2 ms (fixed, or with 1 % noise drawn after the denoise's), e2e
    3 ms more than the denoise."""
    res = CaseResult(case_id="qwen_image_t2i_smoke", repeats=5)
    den = list(denoise_ms * (1 + 0.01 * rng.standard_normal(5)))
    decoding = (
        list(2.0 * (1 + 0.01 * rng.standard_normal(5)))
        if noisy_decoding
        else [2.0, 2.1, 2.0, 1.9, 2.0]
    )
    res.samples = {
        "stage:DenoisingStage": den,
        "stage:DecodingStage": decoding,
        "e2e": [d + 3.0 for d in den],
    }
    return res


def judged_report(
    path: Path, baseline: CaseResult, current: CaseResult, env: dict[str, Any] = ENV
) -> Path:
    """`current` judged (pr_test) against a baseline made of `baseline`, written by the
    library as the report at `path` (the benchmarks that need real reports use it too)."""
    case_id = current.case_id
    base = new_baseline(env).with_scenario(case_id, scenario_from_result(baseline))
    results = Results(environment=env, settings={}, cases={case_id: current})
    write_report(path, report_of(judge(results, base, "pr_test"), base, env))
    return path


def report_of(judgement: Any, base: Baseline, env: dict[str, Any] = ENV) -> Any:
    """The report the library builds of `judgement` against the baseline `base` (pr_test)."""
    return build(
        judgement,
        environment=env,
        baseline_info={"path": "b.json", "sha256": "0" * 64, "platform": "cpu"},
        profile=base.profile("pr_test").to_json(),
        settings={"source": "results"},
        improvement_threshold=base.improvement_threshold,
    )


def reasons_report(
    measured: list[float],
    reference: list[float],
    *,
    baseline_components: dict | None = None,
    components: dict | None = None,
) -> rep.Report:
    """One case: e2e baseline 200 ms (3 % band: bound 206 ms), reference 1.0 ms.

    The CPU profile without its session offsets: these cases are about the runner's
    speed, and five equal samples 5 % over are credible only without them.
    """
    profiles = {
        name: dataclasses.replace(p, session_sd={}) for name, p in default_profiles("cpu").items()
    }
    baseline = Baseline(
        metadata={"platform": "cpu", "hardware": "test-cpu", "created": "t", "updated": "t"},
        profiles=profiles,
        scenarios={
            "glm": Scenario(
                metrics={"e2e": Summary(200.0, 5)},
                reference=Summary(1.0, 5),
                components=baseline_components,
            )
        },
    )
    results = Results(
        environment={"platform": "cpu", "hardware": "test-cpu"},
        settings={},
        cases={
            "glm": CaseResult(
                case_id="glm",
                samples={"e2e": measured},
                reference=reference,
                repeats=len(measured),
                components=components,
            )
        },
    )
    return rep.build(
        judge(results, baseline),
        environment=results.environment,
        baseline_info={"path": "b.json", "sha256": "0" * 64},
        profile=baseline.profile("pr_test").to_json(),
        settings={"source": "run", "inject": None},
        improvement_threshold=0.2,
    )


def record(tag: str | None, scale: float = 1.0, denoise: float = 1.0, **kw: Any) -> dict[str, Any]:
    """A request record in the runtime's format, near h100's qwen_image_t2i figures."""
    scen = json.loads(H100.read_text())["scenarios"]["qwen_image_t2i"]
    stages = [
        {"name": n, "execution_time_ms": ms * scale * (denoise if n == "DenoisingStage" else 1)}
        for n, ms in scen["stages_ms"].items()
    ]
    steps = [ms * scale for ms in scen["denoise_step_ms"].values()]
    total = scen["expected_e2e_ms"] * scale + scen["stages_ms"]["DenoisingStage"] * (denoise - 1)
    rec = {
        "request_id": "r1",
        "commit_hash": "deadbeef",
        "tag": tag,
        "stages": stages,
        "steps": steps,
        "total_duration_ms": total,
    }
    rec.update(kw)
    return rec


def write_log(path: Path, records: list[Any]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    return path


def glm_dit_inputs(config: dict, seed: int = 2) -> dict:
    """Inputs of the GLM-Image DiT at tiny sizes: a CFG pair folded into one batch."""
    import torch  # here, not at the top: the benchmarks import this module without torch

    g = torch.Generator().manual_seed(seed)
    seq = (GLM_LAT_H // 2) * (GLM_LAT_W // 2)
    prior_ids = torch.randint(
        0, config["prior_vq_quantizer_codebook_size"], (GLM_BATCH, seq), generator=g
    )
    # As the pipeline's CFG pair, folded into one batch: row 0 keeps every prior token
    # (cond, all False), row 1 drops them all (uncond, all True).
    drop = torch.tensor([[False], [True]]).expand(GLM_BATCH, seq).contiguous()
    return dict(
        hidden_states=torch.randn(
            GLM_BATCH, config["in_channels"], GLM_LAT_H, GLM_LAT_W, generator=g
        ),
        encoder_hidden_states=torch.randn(
            GLM_BATCH, GLM_GLYPH_LEN, config["text_embed_dim"], generator=g
        ),
        prior_token_id=prior_ids,
        prior_token_drop=drop,
        timestep=torch.tensor([999.0, 499.0]),
        target_size=torch.tensor([[64.0, 96.0]] * GLM_BATCH),
        crop_coords=torch.zeros(GLM_BATCH, 2),
    )


# ---- a project of virtual-clock pipelines (relative checks, --settle) ---------------------

REPO = Path(__file__).resolve().parent.parent

VIRTUAL_PIPES = """
import math
import os
import random

import torch

from perfguard.device.timer import stage, step

SLOW = {slow}


def pipeline(case, platform):
    # Virtual time: the stages last what they say (with 0.5 % noise per process and per
    # run), whatever else the machine is doing; everything else runs for real. The
    # reference workload's clock advances 0.75 ms a reading, so every reading of the
    # runner's speed is the same: the machine's noise reaches neither the normalized
    # figures nor the contention screen.
    rng = random.Random(os.getpid())
    now = [0]
    platform.mark = lambda: now[0]
    ticks = [0]

    def host_ns():
        ticks[0] += 750_000
        return ticks[0]

    platform.host_ns = host_ns
    drift = rng.gauss(0, 0.005)

    def work(ms):
        now[0] += int(ms * 1e6 * math.exp(drift + rng.gauss(0, 0.005)))

    def run():
        with stage("TextEncodingStage"):
            work(2)
        with stage("DenoisingStage"):
            for i in range(4):
                with step(i):
                    work(5 * SLOW)
        with stage("DecodingStage"):
            work(3)
        return torch.zeros(4)

    return run
"""

FACTORY = ("--factory", "pg_rel_pipes:pipeline")
QUICK = ("--platform", "cpu", "--case", "qwen_image_t2i_smoke", "--repeats", "3")


def git_in(cwd: Path, *args: str) -> str:
    who = {"NAME": "perfguard tests", "EMAIL": "tests@perfguard.invalid"}
    env = {
        **os.environ,
        **{f"GIT_{r}_{k}": v for r in ("AUTHOR", "COMMITTER") for k, v in who.items()},
    }
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def make_project(root: Path, monkeypatch: Any) -> Path:
    """A git repository at `root` holding the virtual-clock pipeline (VIRTUAL_PIPES), made
    the caller's working directory and import path (the head side of a relative
    check), with the real case registry: the `project` fixture."""
    root.mkdir()
    (root / "pg_rel_pipes.py").write_text(VIRTUAL_PIPES.format(slow=1.0))
    git_in(root, "init", "-q")
    git_in(root, "add", ".")
    git_in(root, "commit", "-qm", "base")
    monkeypatch.chdir(root)
    monkeypatch.setenv("PERFGUARD_CASES", str(REPO / "cases"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(root))
    return root


def worktrees(root: Path) -> list[str]:
    return [
        ln
        for ln in git_in(root, "worktree", "list", "--porcelain").splitlines()
        if ln.startswith("worktree ")
    ]
