"""CPU peak memory: tensor storage a run allocates, from a dispatch-mode tracker."""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest
import torch

from perfguard.device.platform import Platform
from perfguard.device.timer import stage
from perfguard.measurement.memory import MEASURE, TensorMemory, measure_run
from perfguard.measurement.options import MeasureOptions
from tests.helpers import run_counting

MIB = 1024 * 1024
FLOATS_PER_MIB = MIB // 4


def test_fresh_tensors_count_from_allocation_until_freed() -> None:
    with TensorMemory() as mem:
        x = torch.ones(FLOATS_PER_MIB)
        y = x * 2
        assert mem.live_bytes == 2 * MIB
        del x
        gc.collect()
        assert mem.live_bytes == MIB
        z = torch.empty(3 * FLOATS_PER_MIB)
        del y, z
    assert mem.peak_bytes == 4 * MIB and mem.live_bytes == 0


def test_views_in_place_ops_and_tensors_from_before_allocate_nothing() -> None:
    weight = torch.randn(512, 512)  # 1 MiB, like a model weight built before the run
    with TensorMemory() as mem:
        weight.t()
        weight.view(-1)[::2]
        weight.add_(1.0)
        weight.mul_(0.5)
        torch.transpose(weight, 0, 1).detach()
    assert mem.peak_bytes == 0
    with TensorMemory() as mem:
        out = weight @ weight  # a fresh 1 MiB result
    assert mem.peak_bytes == MIB
    del out


def test_a_loop_that_frees_what_it_allocates_peaks_once() -> None:
    with TensorMemory() as mem:
        acc = torch.zeros(FLOATS_PER_MIB)
        for _ in range(20):
            tmp = acc + 1.0  # freed when the name is rebound next iteration
            acc.copy_(tmp)
        del tmp
    assert mem.peak_bytes == 3 * MIB  # acc, the previous tmp, the new tmp
    assert mem.live_bytes == MIB
    del acc


def test_reset_peak_starts_from_what_is_live() -> None:
    with TensorMemory() as mem:
        keep = torch.ones(FLOATS_PER_MIB)
        torch.ones(2 * FLOATS_PER_MIB)
        assert mem.peak_bytes == 3 * MIB
        mem.reset_peak()
        assert mem.peak_bytes == MIB
    del keep


def _pipeline(extra_mib: int = 0) -> Callable[[], torch.Tensor]:
    weight = torch.randn(64, 64)

    def run() -> torch.Tensor:
        with stage("TextEncodingStage"):
            emb = torch.ones(FLOATS_PER_MIB)
        with stage("DenoisingStage"):
            x = torch.zeros(FLOATS_PER_MIB // 64, 64)
            for _ in range(4):
                x = x @ weight
            if extra_mib:
                torch.zeros(extra_mib * FLOATS_PER_MIB)  # e.g. a leaked activation buffer
        with stage("DecodingStage"):
            out = x.sum() + emb.sum()
        return out

    return run


def test_measure_run_gives_the_run_peak_and_each_stage_peak() -> None:
    memory = measure_run(_pipeline(), Platform())
    # emb (1 MiB) is live through denoising, where x and its successor coexist (2 MiB).
    assert memory.peak_mb == pytest.approx(3.0)
    assert memory.stage_peak_mb["TextEncodingStage"] == pytest.approx(1.0)
    assert memory.stage_peak_mb["DenoisingStage"] == pytest.approx(3.0)
    assert memory.stage_peak_mb["DecodingStage"] == pytest.approx(2.0, abs=0.01)
    bigger = measure_run(_pipeline(extra_mib=2), Platform())
    assert bigger.peak_mb == pytest.approx(memory.peak_mb + 1.0)  # 2 MiB on 1 MiB freed
    assert memory.to_json()["measure"] == MEASURE


class _NoRssPlatform(Platform):
    """CPU, but reading the process's resident set fails the test."""

    def peak_memory_bytes(self) -> int | None:
        raise AssertionError("timed runs must not read the resident set")

    def reset_peak_memory(self) -> None:
        raise AssertionError("timed runs must not reset the resident set")


def test_the_cpu_runner_takes_peak_memory_from_one_tracked_run() -> None:
    options = MeasureOptions(repeats=3, warmup=1)
    result, runs = run_counting(_pipeline, _NoRssPlatform(), options, "mem")
    assert result.status == "ok", result.error
    assert runs == 1 + 1 + 3  # warm-up, the memory run, the timed runs
    assert result.samples["peak_memory"] == [pytest.approx(3.0)]
    # Per stage too, under the names a device run records them with.
    assert result.samples["peak_memory:TextEncodingStage"] == [pytest.approx(1.0)]
    assert result.samples["peak_memory:DenoisingStage"] == [pytest.approx(3.0)]
    assert len(result.samples["e2e"]) == 3
    assert result.memory is not None and result.memory["stage_peak_mb"]["DenoisingStage"] > 0
    assert result.to_json()["memory"] == result.memory


def test_the_real_smoke_pipeline_allocates_the_same_in_every_tracked_run() -> None:
    from perfguard.storage.cases import load_registry
    from perfguard.workloads.registry import build_pipeline

    case = {c.id: c for c in load_registry("cpu")}["qwen_image_t2i_smoke"]
    cpu = Platform()
    pipe = build_pipeline(case, cpu)
    pipe()
    first, second = measure_run(pipe, cpu), measure_run(pipe, cpu)
    assert first == second and first.peak_mb > 0.05 and first.ops > 1000
    assert set(first.stage_peak_mb) >= {"TextEncodingStage", "DenoisingStage", "DecodingStage"}
    assert max(first.stage_peak_mb.values()) == first.peak_mb
