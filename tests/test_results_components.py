"""Results say what was measured: each case's components and per-run counters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from perfguard.device.platform import probe
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.runner import components_of, run_case
from perfguard.presentation.figures import components_line, counters_line
from perfguard.results import CaseResult, Results, pool
from perfguard.storage.cases import Case
from perfguard.storage.reports import read_results, write_results

CASE = Case(id="fake", workload="qwen_image", preset="tiny")


class _Pipeline:
    """A factory's pipeline with declared components and a counter that changes per call."""

    def __init__(self) -> None:
        self.components = {
            "transformer": torch.nn.Linear(4, 3),
            "scheduler": {"class": "diffusers.FlowMatchEulerDiscreteScheduler", "parameters": None},
        }
        self.calls = 0

    def __call__(self) -> torch.Tensor:
        self.calls += 1
        return torch.zeros(2)

    def counters(self) -> dict[str, int]:
        out = {"cache_hits": self.calls}
        if self.calls % 2:
            out["odd_only"] = 1
        return out


def _factory(case: Case, platform: Any) -> _Pipeline:
    return _Pipeline()


def test_components_and_counters_are_read_after_every_measured_run(tmp_path: Path) -> None:
    res = run_case(CASE, probe("cpu"), MeasureOptions(repeats=3, warmup=1), factory=_factory)
    assert res.status == "ok", res.error
    assert res.components == {
        "scheduler": {"class": "diffusers.FlowMatchEulerDiscreteScheduler", "parameters": None},
        "transformer": {"class": "torch.nn.modules.linear.Linear", "parameters": 15},
    }
    # The warm-up is call 1 and the CPU memory run (perfguard.measurement.memory) call 2: measured
    # calls are 3, 4, 5; a counter missing from a run is 0.
    assert res.counters == {"cache_hits": [3, 4, 5], "odd_only": [1, 0, 1]}
    results = Results(environment={"platform": "cpu", "hardware": "h"}, settings={})
    results.cases["fake"] = res
    path = tmp_path / "r.json"
    write_results(path, results)  # validates against the results schema
    back = read_results(path).cases["fake"]
    assert back.components == res.components and back.counters == res.counters


def test_a_factory_that_shows_nothing_records_nothing() -> None:
    def plain(case: Case, platform: Any) -> Any:
        return lambda: torch.ones(1)

    res = run_case(CASE, probe("cpu"), MeasureOptions(repeats=1, warmup=0), factory=plain)
    assert res.status == "ok" and res.components is None and res.counters is None
    data = res.to_json()
    assert "components" not in data and "counters" not in data


def test_modules_held_as_attributes_are_the_components_when_none_are_declared() -> None:
    class Held:
        def __init__(self) -> None:
            self.text_encoder = torch.nn.Embedding(10, 2)
            self.vae_decoder = torch.nn.Conv2d(2, 3, 1)
            self._private = torch.nn.Linear(1, 1)
            self.case = CASE

    assert components_of(Held()) == {
        "text_encoder": {"class": "torch.nn.modules.sparse.Embedding", "parameters": 20},
        "vae_decoder": {"class": "torch.nn.modules.conv.Conv2d", "parameters": 9},
    }


def test_pooled_results_keep_every_runs_counters_in_sample_order() -> None:
    a = CaseResult("c", samples={"e2e": [1.0, 2.0]}, repeats=2, counters={"hits": [4, 4]})
    b = CaseResult("c", samples={"e2e": [3.0]}, repeats=1, counters={"hits": [5], "new": [1]})
    c = CaseResult("c", samples={"e2e": [4.0]}, repeats=1)
    pooled = pool([a, b, c])
    assert pooled.samples["e2e"] == [1.0, 2.0, 3.0, 4.0]
    assert pooled.counters == {"hits": [4, 4, 5, 0], "new": [0, 0, 1, 0]}


def test_the_report_lines_name_classes_sizes_and_counter_ranges() -> None:
    comps = {
        "transformer": {"class": "a.b.QwenImageTransformer2DModel", "parameters": 20_430_000_000},
        "scheduler": {"class": "diffusers.FlowMatchEulerDiscreteScheduler", "parameters": None},
        "vae": {"class": "x.AutoencoderKLQwenImage", "parameters": 126_900_000},
        "tokenizer": {"class": "transformers.Qwen2Tokenizer", "parameters": 0},
    }
    # (?) is a count not known yet; a part without parameters shows its class alone.
    assert components_line(comps) == (
        "scheduler FlowMatchEulerDiscreteScheduler (?), tokenizer Qwen2Tokenizer, "
        "transformer QwenImageTransformer2DModel (20.4B), vae AutoencoderKLQwenImage (126.9M)"
    )
    assert counters_line({"hits": [8, 8], "calls": [3, 4]}) == "calls 3-4, hits 8"
