"""The relative check (`perfguard compare --against DIR|REF`): head and base measured side by side.

A stored baseline compares two moments, often on two machines; on shared or pooled
runners that difference alone can exceed the slowdown a PR introduces. The relative
check measures the base revision and the head on the same runner, at the same time,
and judges the head against that base, as asv's `continuous` and Bencher's relative
benchmarking do.

How it measures (each choice with its reason):

- Blocks of fresh processes. A block starts one worker process of each side, runs every
  selected case once in each (warm-up plus `--repeats` runs), and retires both. Fresh
  processes because the process is the unit of drift on a shared machine (memory
  layout, frequency, neighbours: several percent between processes, more than the runs
  of one process spread), so a verdict must average over processes, never over the runs
  of one.
- Randomized, interleaved order (RMIT, Laaber et al. EMSE'19). Blocks come in mirrored
  pairs, base-head then head-base or the reverse, the first of each pair drawn at
  random: the mirror cancels a trend within the pair (ABBA), the draw keeps the order
  from lining up with periodic load. Inside a block the two sides alternate case by case
  (base, head, head, base, ...), so a case's two measurements are seconds apart; both
  workers are started together and wait idle while the other side runs. Only the first
  `COUNTED_PROCESSES` blocks count the work (one untimed counted run per case and
  side): the counts are exact, and the time buys blocks.
- Paired per-block log ratios (`perfguard.decision.paired.paired_estimate`): the drift that the
  two sides of a block share cancels in their ratio.
- Adaptive, Pinpoint-style. After the minimum number of blocks the verdicts are looked
  at on a fixed schedule of block counts. A metric found clearly different or clearly
  the same at a look keeps that verdict (a sequential test stops where it decides: the
  blocks that follow cannot undo it, as a later contention episode otherwise would);
  the check stops as soon as every metric is decided, when `--max-blocks` is reached,
  or when the next block pair would overrun `--budget-s`. Metrics still open then pass
  with a note.
- Repeated looks cost false alarms, so the schedule is fixed and every look tests at one
  level (`perfguard.decision.paired.alpha_per_look`): the largest at which noise alone
  fails a metric at some scheduled look with probability `alpha` less that level (paid
  for the look a budget stop may add between two scheduled ones), found by simulating
  A/A checks through the same statistic (Pocock's boundary). However the check stops,
  the chance that noise alone fails a metric stays at most `alpha`.

Where the code comes from: the base side's workers run with DIR first on `PYTHONPATH`
and DIR as their working directory (`python -m` puts the working directory ahead of
`PYTHONPATH`), so perfguard's workloads, a `--factory` module or a user's pipeline
package come from DIR; the head side keeps the caller's environment. The cases come
from the caller's registry on both sides (as asv takes its benchmarks from the current
checkout): their definitions are sent to the base's worker, minus fields it does not
know when they hold their default. Before anything is measured, a probe run in the
base environment says where perfguard (and the factory) is imported from, its version,
worker protocol and case fields, so that a base that cannot run the head's cases fails
with one line naming both versions, and a DIR that does not provide the code under test
fails instead of silently comparing the head with itself.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfguard.decision.gate import JudgeOptions
from perfguard.decision.normalize import timing_of
from perfguard.decision.paired import (
    BASE,
    HEAD,
    SIDES,
    Block,
    Comparing,
    Levels,
    RelativeOutcome,
    judge_blocks,
    look_points,
)
from perfguard.decision.verdict import ERROR, MetricVerdict
from perfguard.device.threads import case_threads
from perfguard.errors import PerfguardError
from perfguard.measurement.checkout import commit_of
from perfguard.measurement.launch import Placement, SharedFork, child_environment, import_root
from perfguard.measurement.options import COUNTED_PROCESSES, MeasureOptions
from perfguard.results import CaseResult
from perfguard.storage.cases import Case

DEFAULT_BUDGET_S = 50.0
"""Measurement time a relative check may spend. With workers forked from warm servers a
block of the two smoke cases costs its builds and runs (a few seconds on the 2-core
runner) instead of two interpreters' imports (12-18 s a block when every worker was
spawned, when this was 150 s for 8-12 blocks): 50 s buys more blocks than 150 s did,
and the smoke check ends inside a minute, start-up included. Clear verdicts stop it
sooner."""

DEFAULT_MIN_BLOCKS = 4
"""Two mirrored pairs: the fewest blocks with which the between-block spread (3 degrees
of freedom) is worth a t-interval and a linear trend cancels twice."""

DEFAULT_MAX_BLOCKS = 24
"""The last scheduled look. Past it the interval narrows slowly (1 / sqrt(n)) while
every block costs two process starts."""


@dataclass(frozen=True)
class RelativeOptions:
    """What to compare with and how long to measure: `compare --against` and its knobs.

    `directory` (a checkout of the base revision) or `ref` (a revision of this
    repository, checked out in a temporary worktree); `subdir` is the base's import
    root inside it (sglang: `python`). Blocks are measured until every verdict is clear,
    `max_blocks`, or `budget_s`; `order_seed` fixes the randomized block order.
    `write_baseline` also stores the base side's measurement as a baseline file.
    `timing` compares each block's sides `raw` or `normalized` (each run divided by the
    reference time beside it); None: the platform's default (normalized on CPU).
    """

    directory: str | None = None
    ref: str | None = None
    subdir: str | None = None
    budget_s: float = DEFAULT_BUDGET_S
    min_blocks: int = DEFAULT_MIN_BLOCKS
    max_blocks: int = DEFAULT_MAX_BLOCKS
    order_seed: int | None = None
    write_baseline: str | None = None
    timing: str | None = None

    def __post_init__(self) -> None:
        if self.directory is not None and self.ref is not None:
            raise PerfguardError("use either a directory or a revision as --against, not both")
        if self.directory is None and self.ref is None:
            raise PerfguardError("a relative check needs --against DIR|REF")
        if self.max_blocks < self.min_blocks:
            raise PerfguardError("--max-blocks must be at least --min-blocks")

    def timing_on(self, platform: str) -> str:
        """`timing`, or the default of `platform` (normalized on CPU, raw on devices)."""
        return timing_of({"platform": platform}, self.timing)


PROBE_TIMEOUT_S = 300.0

# ---- the base revision --------------------------------------------------------------------


@dataclass(frozen=True)
class Base:
    """The base revision: where its code is and what its perfguard can run."""

    root: Path
    import_dir: Path
    commit: str | None
    dirty: bool | None
    version: str | None
    protocol: int
    perfguard_file: str | None
    case_fields: frozenset[str]
    option_fields: frozenset[str]
    ref: str | None = None
    factory_file: str | None = None
    worker_module: str = "perfguard.measurement.worker"

    def describe(self) -> str:
        """`DIR (commit abc123def456)`, as the report's first line says it."""
        commit = f"commit {self.commit[:12]}" if self.commit else "not a git checkout"
        dirty = ", uncommitted changes" if self.dirty else ""
        return f"{self.root} ({commit}{dirty})"

    def to_json(self) -> dict[str, Any]:
        return {
            "dir": str(self.root),
            "import_dir": str(self.import_dir),
            "commit": self.commit,
            "dirty": self.dirty,
            "ref": self.ref,
            "perfguard_version": self.version,
            "worker_protocol": self.protocol,
        }


def _head_version() -> str:
    from perfguard import __version__

    return __version__


def _head_protocol() -> int:
    from perfguard.measurement.worker import WORKER_PROTOCOL

    return WORKER_PROTOCOL


def _inside(path: str | None, directory: Path) -> bool:
    if not path:
        return False
    try:
        Path(path).resolve().relative_to(directory.resolve())
    except ValueError:
        return False
    return True


def probe_base(
    directory: str | os.PathLike[str],
    *,
    subdir: str | None = None,
    factory: str | None = None,
    ref: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Base:
    """Check that DIR can serve as the base, and learn what its perfguard can run.

    One line and exit 2 (`PerfguardError`) when DIR does not exist, when the code under
    test (the factory module when there is one, else perfguard's workloads) would not
    come from DIR, when the base's perfguard cannot even be imported, or when it speaks
    another worker protocol.
    """
    root = Path(directory)
    if not root.is_dir():
        raise PerfguardError(f"--against {directory}: no such directory")
    import_dir = root / subdir if subdir else root
    if not import_dir.is_dir():
        raise PerfguardError(f"--against-subdir {subdir}: {import_dir} is not a directory")
    import_dir = import_dir.resolve()
    from perfguard.measurement.profiling import side_request

    where = str(import_dir)
    try:
        info = side_request(
            {"kind": "probe", "factory": factory or ""},
            env=child_environment(env, import_dir=import_dir), cwd=where, root=where,
            label="the base's probe", timeout_s=PROBE_TIMEOUT_S,
        )  # fmt: skip
    except TimeoutError as exc:
        raise PerfguardError(
            f"--against {directory}: importing the base's perfguard took over {PROBE_TIMEOUT_S:g} s"
        ) from exc
    except PerfguardError as exc:
        raise PerfguardError(
            f"--against {directory}: not importable as the base (from {import_dir}): {exc}"
        ) from exc
    where = "the factory module " + factory.partition(":")[0] if factory else "perfguard"
    source = info.get("factory_file") if factory else info.get("file")
    if not _inside(source, import_dir):
        hint = "" if subdir else " (a package in a subdirectory: add --against-subdir, e.g. python)"
        raise PerfguardError(
            f"--against {directory}: not importable as the base: {where} is imported from "
            f"{source}, not from {import_dir}{hint}"
        )
    version = info.get("version")
    protocol = int(info.get("protocol", 1))
    if protocol != _head_protocol():
        raise PerfguardError(
            f"--against {directory}: the base's perfguard {version} speaks worker protocol "
            f"{protocol}, this perfguard {_head_version()} speaks {_head_protocol()}: "
            "it cannot run this revision's cases"
        )
    commit, dirty = commit_of(root)
    return Base(
        root=root.resolve(),
        import_dir=import_dir,
        commit=commit,
        dirty=dirty,
        version=version,
        protocol=protocol,
        perfguard_file=info.get("file"),
        case_fields=frozenset(info.get("case_fields", ())),
        option_fields=frozenset(info.get("option_fields", ())),
        ref=ref,
        factory_file=info.get("factory_file"),
        worker_module=str(info.get("worker_module") or "perfguard.measurement.worker"),
    )


def _defaults(cls: type) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _for_base(
    data: dict[str, Any], known: frozenset[str], defaults: dict[str, Any], what: str, base: Base
) -> dict[str, Any]:
    out = dict(data)
    for key in sorted(set(data) - known):
        if key in defaults and data[key] == defaults[key]:
            del out[key]  # at its default: the base, which lacks it, behaves the same
            continue
        raise PerfguardError(
            f"{what} sets {key} = {data[key]!r}, which the base's perfguard {base.version} "
            f"({base.root}) does not know; this perfguard is {_head_version()}"
        )
    return out


def case_for_base(case: Case, base: Base) -> dict[str, Any]:
    """`case` as the base's worker can read it, or a `PerfguardError` naming both versions."""
    if not base.case_fields:
        return case.to_json()
    defaults = _defaults(Case)
    defaults["prompt_lengths"] = list(defaults.get("prompt_lengths", ()))
    defaults["tags"] = list(defaults.get("tags", ()))
    return _for_base(case.to_json(), base.case_fields, defaults, f"case {case.id!r}", base)


def options_for_base(options: MeasureOptions, base: Base, platform: str) -> dict[str, Any]:
    """The run options as the base's worker can read them (see `case_for_base`)."""
    data = options.to_worker_json(platform)
    if not base.option_fields:
        return data
    defaults = _defaults(MeasureOptions)
    return _for_base(data, base.option_fields, defaults, "the run options", base)


# ---- the schedule ---------------------------------------------------------------------------


def block_order(index: int, previous: str | None, rng: random.Random) -> str:
    """`BH` or `HB`: drawn for the first block of each pair, mirrored for the second."""
    if index % 2 == 1 and previous is not None:
        return previous[::-1]
    return rng.choice((BASE + HEAD, HEAD + BASE))


# ---- the check ------------------------------------------------------------------------------

MeasureBlock = Callable[[int, str, Sequence[Case]], Mapping[str, Mapping[str, CaseResult]]]
"""`measure(index, order, cases)`: one block, each side's processes started in `order`;
for each side (`BASE`, `HEAD`) a result per case."""


def run_relative(
    cases: Sequence[Case],
    measure: MeasureBlock,
    *,
    min_blocks: int = DEFAULT_MIN_BLOCKS,
    max_blocks: int = DEFAULT_MAX_BLOCKS,
    budget_s: float = DEFAULT_BUDGET_S,
    seed: int | None = None,
    clock: Callable[[], float] = time.monotonic,
    judging: JudgeOptions | None = None,
    on_block: Callable[[int, Block, int], None] | None = None,
    compare: Comparing | None = None,
) -> RelativeOutcome:
    """Measure blocks until every verdict is clear, `max_blocks`, or the budget; judge.

    `on_block(index, block, open_metrics)` is told after each block (open_metrics is -1
    where the block was not a look). A case that fails on either side in a block is
    reported as that case's error and not measured again; the others go on. Of
    `judging`, `fail_on_missing`, `advisory`, `allow_output_change` and the rule's alpha
    apply; `compare` says how each block's sides compare (raw by default, on CPU's floor).
    """
    judging = judging or JudgeOptions()
    alpha = judging.rule.alpha
    looks = look_points(min_blocks, max_blocks)
    levels = Levels(alpha, looks, compare or Comparing())
    alpha_look = levels.alpha_look
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    rng = random.Random(seed)
    run = _Blocks(cases, levels)
    started = clock()
    stopped = "max-blocks"
    previous: str | None = None
    while len(run.blocks) < max_blocks:
        n = len(run.blocks)
        if n >= min_blocks and n % 2 == 0:
            pair_s = 2 * sum(b.seconds for b in run.blocks) / n
            if clock() - started + pair_s > budget_s:
                stopped = "budget"
                break
        if not run.active:
            stopped = "every case failed"
            break
        order = block_order(n, previous, rng)
        previous = order
        t0 = clock()
        measured = measure(n, order, run.active)
        block = Block(order, clock() - t0, {s: dict(measured.get(s, {})) for s in (BASE, HEAD)})
        run.add(block)
        open_metrics = run.look() if len(run.blocks) in looks else -1
        if on_block is not None:
            on_block(n, block, open_metrics)
        if open_metrics == 0:
            stopped = "resolved"
            break
    if run.blocks and len(run.blocks) not in run.looked_at:
        run.looked_at.append(len(run.blocks))
    judgement, pooled = judge_blocks(
        [c.id for c in cases],
        run.blocks,
        final=True,
        errors=run.errors,
        latched=run.latched,
        judging=judging,
        levels=levels,
    )
    return RelativeOutcome(
        judgement=judgement,
        blocks=run.blocks,
        pooled=pooled,
        stopped=stopped,
        looks=looks,
        alpha=alpha,
        alpha_look=alpha_look,
        seed=seed,
        elapsed_s=clock() - started,
        looked_at=run.looked_at,
    )


class _Blocks:
    """The blocks of a relative check so far: the cases still measured, each failed
    case's error, and the verdicts latched at a look (a sequential test stops where it
    decides)."""

    def __init__(self, cases: Sequence[Case], levels: Levels) -> None:
        self.ids = [c.id for c in cases]
        self.levels = levels
        self.active = list(cases)
        self.errors: dict[str, str] = {}
        self.latched: dict[tuple[str, str], MetricVerdict] = {}
        self.blocks: list[Block] = []
        self.looked_at: list[int] = []

    def add(self, block: Block) -> None:
        """Keep `block`; a case without a good result on either side leaves the check."""
        self.blocks.append(block)
        for case in list(self.active):
            for side in block.order:
                res = block.results[side].get(case.id)
                if res is None or res.status != "ok":
                    why = "no result" if res is None else (res.error or "failed")
                    self.errors.setdefault(case.id, f"{SIDES[side]}: {why}")
            if case.id in self.errors:
                self.active.remove(case)

    def look(self) -> int:
        """Judge the blocks so far, latch the clear verdicts; how many metrics are open."""
        self.looked_at.append(len(self.blocks))
        judgement, _ = judge_blocks(
            self.ids,
            self.blocks,
            final=False,
            errors=self.errors,
            latched=self.latched,
            levels=self.levels,
        )
        open_metrics = 0
        for c in judgement.cases:
            if c.verdict == ERROR:
                continue
            for m in c.metrics:
                if m.clear:
                    self.latched.setdefault((c.case_id, m.metric), m)
                else:
                    open_metrics += 1
        return open_metrics


# ---- measuring a block in worker processes --------------------------------------------------


@dataclass(frozen=True)
class Side:
    """How one side's worker processes are started and what they are sent."""

    env: dict[str, str]
    cwd: str | None
    options: MeasureOptions
    encode_case: Callable[[Case], dict[str, Any]]
    options_json: dict[str, Any]
    worker_module: str = "perfguard.measurement.worker"
    root: str | None = None
    """The directory the side's workers import perfguard from (None: this process's)."""
    later: tuple[MeasureOptions, dict[str, Any]] | None = None
    """The options of the blocks after the first `COUNTED_PROCESSES`: no counted run.
    The counts are exact, so the first blocks' counted runs are the comparison, and the
    ~130 ms each counted run costs a smoke case buys blocks instead. None: every block
    counts (a base whose worker cannot be told not to)."""

    def for_block(self, index: int) -> tuple[MeasureOptions, dict[str, Any]]:
        """The options, and their wire form, of this side's worker in block `index`."""
        if index < COUNTED_PROCESSES or self.later is None:
            return self.options, self.options_json
        return self.later


class ProcessBlocks:
    """A `MeasureBlock` that runs each block in new worker processes (`Worker`).

    Cases with the same thread count share a pair of processes, started together and
    closed after the cases ran; the sides alternate case by case in the block's order,
    mirrored on every other case. With `--start-method forkserver` both sides (of a
    thread count) fork their workers from one warm server for the whole check, started
    with the first block: a block then costs the builds and the runs, not two
    interpreters' imports, and the time saved buys more blocks while a verdict is open.
    It imports no perfguard module; each worker imports its side's (`launch.SharedFork`).
    One server, not one a side: forks of one server share an offset (docs/relative.md)
    that a server a side put between the sides of every block. `close` ends it.
    """

    def __init__(
        self, sides: Mapping[str, Side], platform: str, devices: Sequence[str] | None = None
    ) -> None:
        self.sides, self.platform, self.devices = sides, platform, devices
        self.starters: dict[tuple[str, int], Any] = {}
        self.servers: dict[int, Any] = {}

    def env_for(self, side: Side, threads: int) -> dict[str, str]:
        where = Placement(self.platform, self.devices, side.options.threads)
        env = child_environment(side.env, placement=where)
        # Two sides start together: one OpenMP thread per core each would make them fight.
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
        return env

    def starter(self, s: str, threads: int, cases: Sequence[Case], index: int) -> Any:
        from perfguard.measurement.workers import WorkerStarter

        side = self.sides[s]
        label = f"{SIDES[s]} worker"
        key = (s, threads)
        if side.options.start_method != "forkserver":
            label += f" (block {index + 1})"
        if key not in self.starters:  # forks come from `shared_server`: no preload of its own
            self.starters[key] = WorkerStarter(
                self.env_for(side, threads), label, side.options.start_method, [],
                cwd=side.cwd, module=side.worker_module, root=side.root,
            )  # fmt: skip
        starter = self.starters[key]
        if side.options.start_method == "forkserver":
            server = self.shared_server(threads, cases)
            if getattr(starter.server, "server", None) is not server:
                starter.server = SharedFork(server, starter.env, side.cwd, starter.root)
        return starter

    def shared_server(self, threads: int, cases: Sequence[Case]) -> Any:
        """The warm server both sides fork from, one per thread count (a dead one's cases
        were errors: it is replaced)."""
        from perfguard.measurement.workers import WarmServer, preload_modules
        from perfguard.workloads.modules import shared_preload

        old, head = self.servers.get(threads), self.sides[HEAD]
        if old is None or not old.alive:
            if old is not None:
                old.kill()
            factory = head.options.factory
            roots = [os.getcwd(), *(side.root for side in self.sides.values() if side.root)]
            names = shared_preload(preload_modules(cases, factory), factory, roots)
            self.servers[threads] = WarmServer(
                self.env_for(head, threads), "warm server of both sides", preload=names,
                root=head.root or import_root(),
            )  # fmt: skip
        return self.servers[threads]

    def __call__(
        self, index: int, order: str, cases: Sequence[Case]
    ) -> dict[str, dict[str, CaseResult]]:
        from perfguard.measurement.workers import Worker, error_result

        sides, platform = self.sides, self.platform
        out: dict[str, dict[str, CaseResult]] = {BASE: {}, HEAD: {}}
        groups: dict[int, list[Case]] = {}
        for case in cases:
            threads = case_threads(case, platform, sides[HEAD].options.threads)
            groups.setdefault(threads, []).append(case)
        for threads, group in groups.items():
            starters = {s: self.starter(s, threads, group, index) for s in order}
            for s in order:  # both servers (or both spawned workers) start together
                starters[s].warm_up()
            workers: dict[str, Worker] = {}
            failed: dict[str, str] = {}
            try:
                for s in order:
                    worker, reason = starters[s].new()
                    if worker is None:
                        failed[s] = reason or "did not start"
                    else:
                        workers[s] = worker
                for i, case in enumerate(group):
                    for s in order if i % 2 == 0 else order[::-1]:
                        side = sides[s]
                        options, options_json = side.for_block(index)
                        if s in failed or not workers[s].alive:
                            why = failed.get(s, f"{SIDES[s]} worker died")
                            out[s][case.id] = error_result(case, why, options)
                            continue
                        out[s][case.id] = workers[s].run(
                            case,
                            options,
                            platform,
                            case_json=side.encode_case(case),
                            options_json=options_json,
                        )
            except BaseException:
                for worker in workers.values():
                    worker.kill()
                raise
            for worker in workers.values():
                worker.close()
        return out

    def close(self) -> None:
        for starter in self.starters.values():
            starter.close()
        self.starters.clear()
        for server in self.servers.values():
            server.close()
        self.servers.clear()

    def __enter__(self) -> ProcessBlocks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def process_blocks(
    sides: Mapping[str, Side],
    platform: str,
    devices: Sequence[str] | None = None,
) -> ProcessBlocks:
    """A `MeasureBlock` running each block in new worker processes (`ProcessBlocks`)."""
    return ProcessBlocks(sides, platform, devices)


def head_side(options: MeasureOptions, platform: str, env: Mapping[str, str] | None = None) -> Side:
    later = options.for_process(COUNTED_PROCESSES)
    return Side(
        env=dict(os.environ if env is None else env),
        cwd=None,
        options=options,
        encode_case=lambda c: c.to_json(),
        options_json=options.to_worker_json(platform),
        later=(later, later.to_worker_json(platform)),
    )


def base_side(
    options: MeasureOptions, base: Base, platform: str, env: Mapping[str, str] | None = None
) -> Side:
    base_options = options.replace(inject={})
    later_options = base_options.for_process(COUNTED_PROCESSES)
    try:
        later = (later_options, options_for_base(later_options, base, platform))
    except PerfguardError:  # a base without `count_work`: its workers count every block
        later = None
    return Side(
        env=child_environment(env, import_dir=base.import_dir),
        cwd=str(base.import_dir),
        options=base_options,
        encode_case=lambda c: case_for_base(c, base),
        options_json=options_for_base(base_options, base, platform),
        worker_module=base.worker_module,
        root=str(base.import_dir),
        later=later,
    )
