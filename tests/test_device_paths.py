"""Device paths on CPU with fakes: capture guards, no parent device context, the worker's
import order, one model per A/B run, and per-stage allocator peaks as metrics.

None of this proves the real device path (see docs/ci.md, "Self-check of a new GPU
runner"); each test pins the decision the code makes when the runtime says what a GPU
runtime would say.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from perfguard.decision.records import REGRESSION
from perfguard.decision.stats import Summary
from perfguard.decision.tolerances import default_profiles
from perfguard.decision.verdict import judge_metric
from perfguard.device import platform as pf
from perfguard.measurement import ab
from perfguard.measurement.runner import tensor_hash
from perfguard.metrics import is_metric_name, metric_class, metrics_of_run, unit
from perfguard.results import CaseResult
from perfguard.storage.baseline import Scenario, parse
from perfguard.storage.cases import load_registry, select
from perfguard.storage.jsonio import validate
from perfguard.workloads import graphs, qwen_image
from perfguard.workloads.presets import build_model
from perfguard.workloads.registry import build_pipeline

REPO = Path(__file__).resolve().parent.parent
CPU = pf.Platform()


@pytest.fixture
def capturing(monkeypatch: pytest.MonkeyPatch) -> None:
    """What torch.cuda says during a plain `torch.cuda.graph` capture."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)


# ---- GLM's in-place prior drop under any capture ------------------------------------------------


def _glm_drop_is_inplace() -> bool:
    model = build_model("glm_image", "tiny")
    emb = torch.randn(2, 3, 4)
    drop = torch.tensor([[True, False, True], [False, False, False]])
    with torch.no_grad():
        out = model.drop_prior_tokens(emb, drop)
    assert torch.equal(out, emb.masked_fill(drop.unsqueeze(-1), 0))
    return out is emb


def test_glm_drop_is_inplace_in_eager() -> None:
    assert _glm_drop_is_inplace()
    assert not graphs.in_static_capture()


def test_glm_drop_takes_masked_fill_under_a_plain_stream_capture(capturing: None) -> None:
    assert graphs.is_stream_capturing() and not graphs.is_in_breakable_cuda_graph()
    assert not _glm_drop_is_inplace()


def test_glm_drop_takes_masked_fill_under_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not _glm_drop_is_inplace()


def test_stream_capture_question_does_not_initialise_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> bool:
        raise AssertionError("asked the runtime before it was initialised")

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", boom)
    assert not graphs.is_stream_capturing()


# ---- Qwen's host varlen metadata under a plain capture -------------------------------------------


def _meta(model: torch.nn.Module, lens: list[int]) -> object:
    return model._joint_varlen_meta(None, lens, len(lens), 8, 4, torch.device("cpu"))


def test_qwen_host_varlen_is_not_baked_into_a_captured_graph(
    monkeypatch: pytest.MonkeyPatch, capturing: None
) -> None:
    def baked(*a: object, **k: object) -> None:
        raise AssertionError("host ints built into a captured graph")

    monkeypatch.setattr(qwen_image, "build_varlen_mask_meta_from_ranges", baked)
    monkeypatch.setattr(qwen_image, "build_varlen_mask_meta", baked)
    model = build_model("qwen_image", "tiny")
    assert _meta(model, [8, 8]) is None  # nothing padded: dense attention, capturable
    with pytest.raises(ValueError, match="cannot be captured in a CUDA graph"):
        _meta(model, [8, 5])


def test_qwen_host_varlen_is_used_in_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = qwen_image.build_varlen_mask_meta_from_ranges
    monkeypatch.setattr(
        qwen_image,
        "build_varlen_mask_meta_from_ranges",
        lambda *a, **k: calls.append("host") or real(*a, **k),
    )
    assert _meta(build_model("qwen_image", "tiny"), [8, 5]) is not None
    assert calls == ["host"]


def test_modulation_cache_off_under_a_plain_stream_capture(capturing: None) -> None:
    assert not qwen_image._modulation_cache_allowed()


# ---- no device context in the parent ----------------------------------------------------------


class _Runtime(types.SimpleNamespace):
    """A torch.cuda stand-in that fails the test if the runtime is initialised."""

    def __init__(self, initialized: bool) -> None:
        super().__init__(touched=[])
        self.initialized = initialized

    def is_initialized(self) -> bool:
        return self.initialized

    def current_device(self) -> int:
        self.touched.append("current_device")
        return 0

    def get_device_name(self, index: int = 0) -> str:
        self.touched.append(f"get_device_name({index})")
        return "NVIDIA H200"

    def device_count(self) -> int:
        return 2


def _cuda_platform(runtime: _Runtime) -> pf.CudaPlatform:
    class Fake(pf.CudaPlatform):
        @property
        def module(self) -> _Runtime:
            return runtime

    return Fake()


def test_device_name_asks_the_driver_not_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    monkeypatch.setattr(pf, "_nvidia_smi_name", lambda dev: asked.append(dev) or "NVIDIA H200")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    runtime = _Runtime(initialized=False)
    plat = _cuda_platform(runtime)
    env = pf.fingerprint(plat)
    assert env["device_name"] == "NVIDIA H200" and env["hardware"] == "nvidia-h200"
    assert runtime.touched == [] and asked and set(asked) == {"3"}


def test_device_name_from_the_runtime_once_it_is_initialised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pf, "_nvidia_smi_name", lambda dev: pytest.fail("asked nvidia-smi"))
    runtime = _Runtime(initialized=True)
    assert _cuda_platform(runtime).device_name() == "NVIDIA H200"
    assert runtime.touched == ["current_device", "get_device_name(0)"]


def test_device_name_falls_back_to_the_first_visible_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pf, "_nvidia_smi_name", lambda dev: None)  # no nvidia-smi
    runtime = _Runtime(initialized=False)
    assert _cuda_platform(runtime).device_name() == "NVIDIA H200"
    assert runtime.touched == ["get_device_name(0)"]


# ---- the worker narrows its devices before importing torch -------------------------------------


def test_rank_worker_narrows_devices_before_torch_is_imported(tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"case": {}, "options": {"platform": "cuda"}}))
    script = textwrap.dedent(
        f"""
        import importlib.abc, os, sys
        seen = []
        class Watch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "torch" and not seen:
                    seen.append(os.environ.get("CUDA_VISIBLE_DEVICES"))
                return None
        sys.meta_path.insert(0, Watch())
        from perfguard.measurement import worker as _worker
        try:
            _worker._rank({str(request)!r}, {str(tmp_path / "result.json")!r})
        except BaseException:
            pass  # no CUDA here: the rank stops at probe(); the import already happened
        print("torch saw", seen)
        """
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "RANK": "0",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "CUDA_VISIBLE_DEVICES": "3,5",
    }
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert "torch saw ['5']" in out.stdout, out.stdout + out.stderr


# ---- perfguard ab builds one model for toggle-only variants --------------------------------------

CASE = select(load_registry("cpu", REPO / "cases"), ids=["qwen_image_t2i_smoke"])[0]


def test_ab_builds_one_pipeline_and_switches_its_toggles(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[object] = []
    seen: list[tuple[bool, bool]] = []

    def factory(case, platform):  # type: ignore[no-untyped-def]
        pipe = build_pipeline(case, platform)
        built.append(pipe)
        call = type(pipe).__call__

        class Spy(type(pipe)):  # type: ignore[misc]
            def __call__(self):  # type: ignore[no-untyped-def]
                t = self.transformer
                seen.append((t.qwen_modulation_cache, t.qwen_varlen_host_meta))
                return call(self)

        pipe.__class__ = Spy
        return pipe

    monkeypatch.setattr(ab, "_default_factory", factory)
    off, on = {"qwen_modulation_cache": False}, {"qwen_modulation_cache": True}
    res = ab.run_ab(CASE, off, on, CPU, pairs=2)
    assert len(built) == 1 and res.shared_model and res.to_json()["shared_model"]
    # warm-up A, warm-up B, then ABBA: the model ran each variant's code path
    assert [s[0] for s in seen] == [False, True, False, True, True, False]
    assert all(s[1] for s in seen)  # the other toggle is left alone
    alone = build_pipeline(CASE.with_toggles(qwen_modulation_cache=False), CPU)
    assert res.hashes["A"] == tensor_hash(alone())


def test_ab_builds_two_pipelines_when_the_variants_change_more_than_toggles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[object] = []
    real = ab._default_factory
    monkeypatch.setattr(ab, "_default_factory", lambda c, p: built.append(c) or real(c, p))
    res = ab.run_ab(CASE, {"steps": 2}, {"steps": 3}, CPU, pairs=2)
    assert len(built) == 2 and not res.shared_model


# ---- per-stage allocator peaks are metrics ------------------------------------------------------


RUN = {
    "e2e_ms": 10.0,
    "stages_ms": {"DenoisingStage": 8.0, "DecodingStage": 2.0},
    "steps_ms": [4.0, 4.0],
    "avg_step_ms": 4.0,
    "median_step_ms": 4.0,
    "peak_memory_mb": 900.0,
    "stage_peak_memory_mb": {"DenoisingStage": 900.0, "DecodingStage": 300.0},
}


def test_stage_peaks_become_metrics_of_the_peak_memory_class() -> None:
    metrics = metrics_of_run(RUN)
    assert metrics["peak_memory:DecodingStage"] == 300.0
    assert metrics["peak_memory:DenoisingStage"] == 900.0
    for name in metrics:
        assert is_metric_name(name)
    assert metric_class("peak_memory:DecodingStage") == "peak_memory"
    assert unit("peak_memory:DecodingStage") == "MB"
    assert not is_metric_name("peak_memory:")
    cpu_run = {**RUN, "stage_peak_memory_mb": {}}
    assert not any(m.startswith("peak_memory:") for m in metrics_of_run(cpu_run))


def _result() -> CaseResult:
    samples = {k: [v] * 3 for k, v in metrics_of_run(RUN).items()}
    return CaseResult(case_id="c", status="ok", samples=samples, repeats=3)


def test_stage_peaks_are_stored_in_the_baseline_and_read_back() -> None:
    from perfguard.storage.baseline import new_baseline
    from perfguard.storage.refresh import scenario_from_result

    scen = scenario_from_result(_result())
    data = scen.to_json()
    assert data["stage_peak_memory"]["DecodingStage"]["median"] == 300.0
    env = {"platform": "cuda", "hardware": "nvidia-h200"}
    doc = new_baseline(env).with_scenario("c", scen).to_json()
    back = parse(doc, "b.json").scenarios["c"]
    assert back.metrics["peak_memory:DecodingStage"].median == 300.0
    assert Scenario.from_json(data).metrics.keys() == scen.metrics.keys()
    doc["scenarios"]["c"]["stage_peak_memory"]["bad stage!"] = data["stage_peak_memory"][
        "DecodingStage"
    ]
    with pytest.raises(Exception, match="stage_peak_memory"):
        parse(doc, "b.json")


def test_results_with_stage_peaks_pass_the_results_schema() -> None:
    from perfguard.results import Results

    res = Results(environment={"platform": "cuda", "hardware": "x"}, settings={})
    res.cases["c"] = _result()
    validate(res.to_json(), "results", "r.json")


def test_a_stage_peak_regression_is_gated() -> None:
    band = default_profiles("cuda")["pr_test"].band("peak_memory:DecodingStage")
    base = Summary(median=300.0, n=5)
    v = judge_metric("peak_memory:DecodingStage", [364.0 + 80.0] * 5, base, band)
    assert v.verdict == REGRESSION
    ok = judge_metric("peak_memory:DecodingStage", [301.0] * 5, base, band)
    assert ok.verdict != REGRESSION
