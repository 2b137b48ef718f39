"""The subprocess side of `perfguard.measurement.workers` (not a public command).

    python -m perfguard.measurement.worker serve --result-fd N
        Report ready, then run each case requested on stdin (one JSON line:
        {"case": ..., "options": ...}) and write {"case_id": ..., "result": ...} to fd N.
    python -m perfguard.measurement.worker rank --request FILE --result FILE
        One rank of a multi-device case, started by torchrun; rank 0 writes the result.

Imports that pull in torch happen after the process is set up, so that the visible-device
variable is narrowed before any device runtime reads it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from perfguard.device.pinning import die_with_parent, narrow_visible_devices, pin_cores

WORKER_PROTOCOL = 1
"""The version of the request / result messages above. A relative check
(`perfguard compare --against`) runs the base revision's worker with the head's cases and
refuses a base whose protocol differs; a worker too old to say (no `protocol` in its
`ready` message, no `WORKER_PROTOCOL`) speaks version 1. Bump it with any change a worker
of the other version would misread."""


def _run(case: Any, platform: Any, options: Any) -> Any:
    """`runner.run_case` with the parent's `MeasureOptions` (the factory imported here)."""
    from perfguard.measurement.runner import run_case

    return run_case(case, platform, options)


def _serve(result_fd: int) -> int:
    # The parent pinned this worker's devices in its environment before starting it;
    # the cores it chose for a CPU worker are applied here, before torch is imported.
    cores = pin_cores()
    die_with_parent()
    out = os.fdopen(result_fd, "w", buffering=1, encoding="utf-8")

    def send(msg: dict[str, Any]) -> None:
        out.write(json.dumps(msg, allow_nan=False) + "\n")
        out.flush()

    # Importing torch and the runner is the slow part of a start: do it before `ready`.
    import perfguard.measurement.runner  # noqa: F401
    from perfguard import __version__
    from perfguard.device.inject import InjectionUnmatched
    from perfguard.device.platform import probe
    from perfguard.measurement.options import MeasureOptions
    from perfguard.measurement.worker_handle import case_from_json, error_result

    send(
        {
            "ready": True,
            "pid": os.getpid(),
            "cores": cores,
            "protocol": WORKER_PROTOCOL,
            "perfguard": __version__,
        }
    )
    platforms: dict[str, Any] = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        case = case_from_json(request["case"])
        name, options = MeasureOptions.from_worker_json(request["options"])
        try:
            if name not in platforms:
                platforms[name] = probe(name)
            result = _run(case, platforms[name], options)
        except InjectionUnmatched as exc:  # the command line's mistake: the parent exits 2
            send({"case_id": case.id, "usage_error": str(exc)})
            continue
        except Exception as exc:  # a bad factory or platform: this case's error
            result = error_result(case, f"{type(exc).__name__}: {exc}", options)
        send({"case_id": case.id, "result": result.to_json()})
    return 0


def _rank(request_path: str, result_path: str) -> int:
    # Nothing that imports torch before the visible devices are narrowed
    # (perfguard.device.pinning).
    from perfguard.storage.jsonio import read_json, write_json_atomic  # no torch

    die_with_parent()
    request = read_json(request_path)
    platform_name = request["options"]["platform"]
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    narrow_visible_devices(platform_name, local_rank)

    import torch
    import torch.distributed as dist

    from perfguard.device.inject import InjectionUnmatched
    from perfguard.device.platform import probe
    from perfguard.measurement.options import MeasureOptions
    from perfguard.measurement.worker_handle import case_from_json

    options_data = request["options"]
    case = case_from_json(request["case"])
    name, options = MeasureOptions.from_worker_json(options_data)
    platform = probe(name)
    backend = {"cpu": "gloo", "npu": "hccl"}.get(platform.name, "nccl")
    device = platform.device(0)
    if platform.name != "cpu":
        platform.module.set_device(device)  # type: ignore[attr-defined]
    # A collective that waits longer than the case may run is a hang, not a slow case.
    wait = timedelta(seconds=max(60.0, 2 * options.timeout) if options.timeout else 1800.0)
    dist.init_process_group(backend, timeout=wait)
    dist.barrier()
    if rank == 0:  # every rank has joined: the parent's --timeout starts now
        Path(result_path + ".started").touch()
    try:
        try:
            measured = _run(case, platform, options)
        except InjectionUnmatched as exc:  # every rank runs the same stages: all stop here
            if rank == 0:
                write_json_atomic(result_path, {"usage_error": str(exc)})
            return 2
        result = _combine(measured, rank, world, device, torch, dist)
        if rank == 0:
            write_json_atomic(result_path, result.to_json())
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return 0


def _combine(result: Any, rank: int, world: int, device: Any, torch: Any, dist: Any) -> Any:
    """Rank 0's result with every sample replaced by its maximum over the ranks.

    A run of a parallel pipeline ends when its slowest rank does, so MAX is the figure a
    user waits for. The layout (metric names, run counts, errors) is exchanged first so
    that the all-reduce only runs when every rank measured the same things.
    """
    layout = {
        "status": result.status,
        "error": result.error,
        "metrics": {name: len(values) for name, values in sorted(result.samples.items())},
        "hash": result.output_hash,
        "deterministic": result.deterministic,
        "e2e": result.samples.get("e2e", []),
    }
    layouts: list[Any] = [None] * world
    dist.all_gather_object(layouts, layout)
    failed = [(r, lay) for r, lay in enumerate(layouts) if lay["status"] != "ok"]
    if failed:
        r, lay = failed[0]
        result.status = "error"
        result.error = result.error if r == rank else f"rank {r}: {lay['error']}"
        return result
    if any(lay["metrics"] != layout["metrics"] for lay in layouts):
        result.status = "error"
        result.error = "ranks measured different metrics; cannot combine them"
        return result
    names = sorted(result.samples)
    flat = [v for name in names for v in result.samples[name]]
    tensor = torch.tensor(flat, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    values = tensor.cpu().tolist()
    at = 0
    for name in names:
        n = len(result.samples[name])
        result.samples[name] = values[at : at + n]
        at += n
    result.case["ranks"] = world
    result.case["rank_e2e_ms"] = [lay["e2e"] for lay in layouts]
    # Every rank ends with the same output (CFG-parallel gathers both halves).
    result.deterministic = bool(
        all(lay["deterministic"] for lay in layouts) and len({lay["hash"] for lay in layouts}) == 1
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfguard.measurement.worker")
    sub = parser.add_subparsers(dest="mode", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("--result-fd", type=int, required=True)
    rank = sub.add_parser("rank")
    rank.add_argument("--request", required=True)
    rank.add_argument("--result", required=True)
    args = parser.parse_args(argv)
    if args.mode == "serve":
        return _serve(args.result_fd)
    return _rank(args.request, args.result)


if __name__ == "__main__":
    sys.exit(main())
