"""Work counting on small hand-built modules whose ops, FLOPs, bytes and syncs are known.

The real pipelines' totals change with every torch release, so they are not pinned
here; these modules' counts follow from their shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from perfguard.device.platform import Platform
from perfguard.device.timer import stage, step
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.runner import output_sketch, run_case
from perfguard.measurement.work import WorkCounter, counted_run, host_sync
from perfguard.storage.cases import Case
from tests.helpers import run_counting

torch.manual_seed(0)


def _count(fn: Callable[[], Any]) -> WorkCounter:
    with torch.inference_mode(), WorkCounter() as counter:
        fn()
    return counter


def test_a_linear_layer_counts_its_kernels_flops_and_output_bytes() -> None:
    lin = torch.nn.Linear(8, 16)
    x = torch.randn(4, 8)
    counter = _count(lambda: lin(x))
    # aten::linear runs as t + addmm (decomposed, as torch's FlopCounterMode does).
    assert dict(counter.op_counts) == {"aten::t": 1, "aten::addmm": 1}
    assert counter.ops == 2
    assert counter.flops == 2 * 4 * 8 * 16
    assert counter.alloc_bytes == 4 * 16 * 4  # the [4, 16] float32 output; t is a view
    assert counter.syncs == 0


def test_attention_on_cpu_takes_torchs_flash_formula() -> None:
    q = torch.randn(1, 2, 8, 4)
    counter = _count(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))
    # torch's sdpa formula: 2 matmuls of [8, 4] x [4, 8] per head, 2 FLOPs a multiply-add.
    assert counter.flops == 2 * (2 * 2 * 8 * 8 * 4)
    assert counter.op_counts["aten::_scaled_dot_product_flash_attention_for_cpu"] == 1


@pytest.mark.parametrize(
    ("what", "fn", "syncs"),
    [
        ("nonzero", lambda x, m: torch.nonzero(m), 1),
        ("item", lambda x, m: x.sum().item(), 1),
        ("bool()", lambda x, m: bool(x.sum() > 0), 1),
        ("boolean mask read", lambda x, m: x[m], 1),
        ("boolean mask write in place", lambda x, m: x[m].mul_(0.0), 1),
        ("masked multiply in place", lambda x, m: x.__setitem__(m, x[m] * 0.0), 2),
        ("masked_select", lambda x, m: torch.masked_select(x, m), 1),
        ("unique", lambda x, m: torch.unique(m), 1),
        ("repeat_interleave, no output_size", lambda x, m: torch.repeat_interleave(m.long()), 1),
        (
            "repeat_interleave with output_size",
            lambda x, m: torch.repeat_interleave(torch.tensor([1, 2]), output_size=3),
            0,
        ),
        ("masked_fill (static shapes)", lambda x, m: x.masked_fill(m, 0.0), 0),
        ("integer index", lambda x, m: x[torch.tensor([0, 1])], 0),
    ],
)
def test_host_syncs_are_counted_from_the_op_stream(what: str, fn: Any, syncs: int) -> None:
    x = torch.randn(6)
    m = torch.tensor([True, False, True, True, False, False])
    counter = _count(lambda: fn(x.clone(), m))
    assert counter.syncs == syncs, (what, dict(counter.op_counts))


class _OnDevice(torch.Tensor):
    """A CPU tensor that says it lives on a CUDA device (for the argument checks only)."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)


def test_a_blocking_device_to_host_copy_is_a_sync_and_a_non_blocking_one_is_not() -> None:
    on_device = torch.ones(2).as_subclass(_OnDevice)
    to_copy, copy_ = torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default
    cpu = torch.device("cpu")
    assert host_sync("aten::_to_copy", to_copy, (on_device,), {"device": cpu})
    assert not host_sync(
        "aten::_to_copy", to_copy, (on_device,), {"device": cpu, "non_blocking": True}
    )
    assert host_sync("aten::copy_", copy_, (torch.ones(2), on_device), {})
    assert not host_sync("aten::copy_", copy_, (torch.ones(2), on_device, True), {})
    # Host to host, and host to device, do not wait for the device.
    assert not host_sync("aten::_to_copy", to_copy, (torch.ones(2),), {"device": cpu})
    assert not host_sync("aten::copy_", copy_, (on_device, torch.ones(2)), {})


def _staged(extra_linear: bool = False, masked: bool = True) -> Callable[[], torch.Tensor]:
    torch.manual_seed(0)  # the masked read allocates as many values as the mask selects
    lin = torch.nn.Linear(8, 16)
    x = torch.randn(4, 8)

    def run() -> torch.Tensor:
        with torch.inference_mode():
            with stage("TextEncodingStage"):
                y = lin(x)
                if extra_linear:
                    y = lin(x)
            with stage("DenoisingStage"):
                for i in range(3):
                    with step(i):
                        y = y * 2
                        if masked:
                            y[y > 0] *= 0.5
            return y

    return run


def test_a_counted_run_gives_each_stage_and_step_its_own_counts() -> None:
    work, memory = counted_run(_staged(), Platform())
    assert work.stages["TextEncodingStage"] == {"ops": 2, "flops": 1024, "alloc": 256, "syncs": 0}
    assert len(work.steps) == 3
    # Per step: mul, gt, index (mask read), mul_, index_put_ (mask write): 2 syncs.
    assert all(s["ops"] == 5 and s["syncs"] == 2 for s in work.steps)
    assert work.stages["DenoisingStage"]["ops"] == 15
    assert work.op_counts["DenoisingStage"]["aten::index_put_"] == 3
    assert work.sync_ops["DenoisingStage"] == {"aten::index": 3, "aten::index_put_": 3}
    metrics = work.metrics()
    assert metrics["ops"] == 17 and metrics["ops:DenoisingStage"] == 15
    assert metrics["syncs_per_step"] == 2 and metrics["flops:TextEncodingStage"] == 1024
    assert work.context["device_type"] == "cpu" and work.context["torch"] == torch.__version__
    # On CPU the same run is the tensor-memory run (one dispatch mode, not two).
    assert memory is not None and memory.stage_peak_mb["TextEncodingStage"] > 0


def test_the_counts_are_the_same_in_every_run_of_a_build() -> None:
    pipe = _staged()
    first, _ = counted_run(pipe, Platform())
    second, _ = counted_run(pipe, Platform())
    assert first == second


def test_more_work_shows_in_the_stage_that_does_it() -> None:
    base, _ = counted_run(_staged(), Platform())
    more, _ = counted_run(_staged(extra_linear=True), Platform())
    assert (
        more.stages["TextEncodingStage"]["flops"] == 2 * base.stages["TextEncodingStage"]["flops"]
    )
    assert more.stages["DenoisingStage"] == base.stages["DenoisingStage"]


def test_the_runner_keeps_one_counted_run_per_build_and_the_output_reference() -> None:
    result, runs = run_counting(_staged, Platform(), MeasureOptions(repeats=2, warmup=1), "work")
    assert result.status == "ok", result.error
    assert runs == 1 + 1 + 2  # warm-up, the counted run, the timed runs
    assert result.work is not None and len(result.work) == 1
    assert result.work[0]["stages"]["DenoisingStage"]["syncs"] == 6
    assert result.output_sketch is not None and result.output_sketch["shape"] == [4, 16]
    again = type(result).from_json(result.case_id, result.to_json())
    assert again.work == result.work and again.output_sketch == result.output_sketch


def test_counters_only_runs_no_timed_run() -> None:
    opts = MeasureOptions(repeats=5, warmup=0, counters_only=True)
    result, runs = run_counting(_staged, Platform(), opts, "work")
    assert result.status == "ok", result.error
    assert runs == 2  # one plain run (its output is compared), one counted
    assert result.repeats == 0 and "e2e" not in result.samples
    assert result.work and result.output_hash and result.output_sketch


def test_a_build_told_not_to_count_times_its_runs_and_counts_nothing() -> None:
    opts = MeasureOptions(repeats=3, warmup=1, count_work=False)
    result, runs = run_counting(_staged, Platform(), opts, "work")
    assert result.status == "ok", result.error
    assert runs == 1 + 3  # the warm-up and the timed runs: no counted run
    assert result.work is None and result.memory is None
    assert len(result.samples["e2e"]) == 3 and result.output_hash
    # A counters-only measurement exists to count: it counts whatever count_work says.
    only = MeasureOptions(repeats=3, warmup=0, counters_only=True, count_work=False)
    counted, runs = run_counting(_staged, Platform(), only, "work")
    assert counted.work and runs == 2


def test_count_work_travels_to_a_worker_only_when_it_is_off() -> None:
    on, off = MeasureOptions(), MeasureOptions(count_work=False)
    assert "count_work" not in on.to_worker_json("cpu")  # the wire older workers read
    assert off.to_worker_json("cpu")["count_work"] is False
    assert MeasureOptions.from_worker_json(off.to_worker_json("cpu")) == ("cpu", off)


def test_a_pipeline_that_fails_under_the_mode_loses_its_counts_not_its_timings() -> None:
    def factory(case: Case, platform: Platform) -> Callable[[], torch.Tensor]:
        return _staged()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("an op the mode cannot see through")

    case = Case(id="work", workload="qwen_image", preset="tiny")
    mp = pytest.MonkeyPatch()
    import perfguard.measurement.runner as runner

    mp.setattr(runner, "counted_run", broken)
    try:
        result = run_case(case, Platform(), MeasureOptions(repeats=2, warmup=0), factory=factory)
    finally:
        mp.undo()
    assert result.status == "ok" and len(result.samples["e2e"]) == 2
    assert result.work is None
    assert "an op the mode cannot see through" in (result.work_error or "")


def test_the_output_sketch_is_the_output_when_small_and_block_means_when_not() -> None:
    small = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    sketch = output_sketch(small)
    assert sketch["shape"] == sketch["sketch_shape"] == [3, 4]
    image = torch.rand(2, 3, 128, 128)
    big = output_sketch(image)
    assert big["shape"] == [2, 3, 128, 128]
    n = 1
    for d in big["sketch_shape"]:
        n *= d
    assert n <= 4096 and big["sketch_shape"][:2] == [2, 3]
    assert output_sketch(image) == big  # a fixed function of the output


def test_on_a_device_run_an_op_on_host_tensors_is_not_a_sync() -> None:
    m = torch.tensor([True, False, True])
    with torch.inference_mode(), WorkCounter("cuda") as counter:
        torch.nonzero(m)  # a host tensor on a CUDA run: nobody waits for the device
        m.sum().item()
    assert counter.syncs == 0 and counter.op_counts["aten::nonzero"] == 1
    with torch.inference_mode(), WorkCounter("cpu") as counter:
        torch.nonzero(m)  # on a CPU run it stands for the device tensor it would be
    assert counter.syncs == 1
