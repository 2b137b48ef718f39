"""perfguard: performance-regression gate and baseline manager for diffusion-model serving.

The library API (`perfguard.api`, see the README's "Library API"): the functions each
command calls, and the values they take and return. Names are imported on first use,
so `import perfguard` costs nothing and never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    # what the commands do
    "run": "perfguard.api",
    "run_cases": "perfguard.api",
    "gen_baselines": "perfguard.api",
    "check": "perfguard.api",
    "check_results": "perfguard.api",
    "check_perf_log": "perfguard.api",
    "check_relative": "perfguard.api",
    "judge": "perfguard.api",
    "judge_results": "perfguard.api",
    "calibrate": "perfguard.api",
    "write_report": "perfguard.api",
    "select_cases": "perfguard.api",
    "load_baseline": "perfguard.api",
    "probe": "perfguard.api",
    # the values they take
    "MeasureOptions": "perfguard.measurement.options",
    "Selection": "perfguard.storage.cases",
    "RelativeOptions": "perfguard.measurement.relative",
    "RefreshOptions": "perfguard.storage.refresh",
    "CalibrateOptions": "perfguard.api",
    "Outputs": "perfguard.api",
    "JudgeOptions": "perfguard.decision.options",
    "Case": "perfguard.storage.cases",
    # and return
    "Results": "perfguard.results",
    "CaseResult": "perfguard.results",
    "Baseline": "perfguard.storage.baseline",
    "Report": "perfguard.storage.reports",
    "BaselineUpdate": "perfguard.api",
    "Calibration": "perfguard.api",
    "PerfguardError": "perfguard.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'perfguard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
