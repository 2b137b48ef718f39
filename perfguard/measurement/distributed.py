"""Cases that need more than one device, through torchrun.

Cases with `num_devices = N > 1` are launched with `python -m torch.distributed.run
--standalone --nproc-per-node N -m perfguard.measurement.worker rank ...` on N devices of the list;
each rank narrows the visible-devices variable to its own device, initialises the process
group (NCCL on CUDA/ROCm, HCCL on NPU, gloo on CPU) and runs the case. The pipeline uses
the group where it has a parallel implementation (the Qwen-Image and GLM-Image pipelines
run CFG-parallel on two ranks); afterwards the ranks all-reduce their per-run timings
with MAX, because a step of a parallel pipeline ends when its slowest rank does, and rank
0 writes the result. These cases run one at a time, after the single-device ones, since
they share the interconnect and would disturb each other's figures. On CPU the ranks are
processes on the same cores, with torchrun's default of one thread each: the figures
show the launch, the collectives and the parallel pipeline working, not a speed-up.
torchrun starts the ranks itself, so no warm server can fork them.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from perfguard.errors import PerfguardError
from perfguard.measurement.launch import describe_exit
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.worker_handle import (
    WORKER_MODULE,
    error_result,
    kill_grace_s,
    kill_tree,
)
from perfguard.results import CaseResult
from perfguard.storage.cases import Case
from perfguard.storage.jsonio import read_json, write_json_atomic

TORCHRUN_STARTUP_S = 300.0
"""How long torchrun's rendezvous and the ranks' imports may take before the case starts.

`--timeout` counts from the moment every rank has joined the process group (rank 0 then
writes a marker file), so a slow start does not eat into the case's own time.
"""


def run_distributed(
    case: Case, options: MeasureOptions, platform: str, env: dict[str, str], label: str
) -> CaseResult:
    """Launch `case` on `case.num_devices` ranks through torchrun; rank 0's result."""
    with tempfile.TemporaryDirectory(prefix="perfguard-dist-") as tmp:
        request, result, log = Path(tmp, "request.json"), Path(tmp, "result.json"), Path(tmp, "log")
        request_json = {"case": case.to_json(), "options": options.to_worker_json(platform)}
        write_json_atomic(request, request_json)
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            "--standalone",  # rendezvous on localhost with a free port
            "--nproc-per-node", str(case.num_devices),
            "-m", WORKER_MODULE, "rank",
            "--request", str(request), "--result", str(result),
        ]  # fmt: skip
        marker = Path(str(result) + ".started")
        started = time.monotonic()
        with log.open("wb") as log_fh:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )  # fmt: skip
            why = _wait_distributed(proc, marker, options.timeout)
        text = log.read_text(errors="replace")
        if text:
            print(text, end="" if text.endswith("\n") else "\n", file=sys.stderr, flush=True)
        if why is not None:
            return error_result(
                case, f"timeout: killed after {time.monotonic() - started:.1f} s ({why})", options
            )
        if result.is_file():
            data = read_json(result)
            if "usage_error" in data:
                raise PerfguardError(str(data["usage_error"]))
            return CaseResult.from_json(case.id, data)
        last = [ln.strip() for ln in text.splitlines() if ln.strip()][-1:] or [""]
        how = describe_exit(proc.returncode)
        message = f"{label} (torchrun, {case.num_devices} ranks) failed ({how})"
        return error_result(case, message + (f": {last[0][:300]}" if last[0] else ""), options)


def _wait_distributed(
    proc: subprocess.Popen[Any], marker: Path, timeout: float | None
) -> str | None:
    """Wait for torchrun; kill its tree past the deadline and say which one it was."""
    start_deadline = time.monotonic() + TORCHRUN_STARTUP_S
    case_deadline: float | None = None
    while True:
        try:
            proc.wait(timeout=0.2)
            return None
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if case_deadline is None and marker.exists():
            if timeout is None:
                proc.wait()
                return None
            case_deadline = now + timeout + kill_grace_s(timeout)
        if case_deadline is None and now > start_deadline:
            kill_tree(proc)
            return f"the ranks did not all start within {TORCHRUN_STARTUP_S:g} s"
        if case_deadline is not None and now > case_deadline:
            kill_tree(proc)
            return f"--timeout {timeout:g} s; the case did not stop by itself"
