"""Benchmark cases and the per-platform registries that declare them.

A registry is a directory of TOML files, each a list of `[[case]]` tables validated by
`schemas/case.schema.json`. Every `*.toml` directly in it is read or reported, never
skipped in silence (a file whose cases never run and nothing says so is how a gate rots):

- `common.toml` holds cases for every platform;
- `<platform>.toml` (`cuda`, `rocm`, `npu`, `cpu`) holds cases for that platform, as
  sglang selects its NPU config module on NPU;
- any other file (`my_team.toml`) must say which platforms it is for with a top-level
  `platforms = ["cuda", "rocm"]`; one that does not is an error naming it.

A file with no `[[case]]` is an error too (an empty or truncated file is not "no cases").

Ids are unique across the files of a platform. Two identical definitions of one id
collapse to one; two different definitions are an error naming both files (sglang keeps
the first silently, which hides an edit made in the wrong file).
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

from perfguard.errors import PerfguardError
from perfguard.results import Results
from perfguard.storage.jsonio import read_text, schema

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ENV_CASES = "PERFGUARD_CASES"
PLATFORM_NAMES = ("cuda", "rocm", "npu", "cpu")
"""The platforms perfguard knows (`--platform`), and those a registry file can name."""
REGISTRY_PLATFORMS = PLATFORM_NAMES
TOGGLES = ("glm_prior_drop_inplace", "qwen_modulation_cache", "qwen_varlen_host_meta")
DIFFUSERS = "diffusers"
"""The workload that runs a user's diffusers pipeline (`perfguard.interop.diffusers`)."""
SERVER = "server"
"""The workload that drives a running server over HTTP (`perfguard.measurement.serving`)."""
SERVER_FIELDS = (
    "url",
    "launch",
    "ready",
    "api",
    "request",
    "concurrency",
    "requests",
    "warmup",
    "rate",
    "perf_log",
    "metrics",
    "rounds",
    "ready_timeout_s",
    "request_timeout_s",
)
"""A server case's own fields (docs/serving.md); no other case has them."""


@dataclass(frozen=True)
class Case:
    """One benchmark case: a workload at a model size with its sampling parameters.

    `prompt_lengths` gives one text length per batch row; rows shorter than the longest
    are padded, which is what exercises the masked joint-attention path. Optimization
    `toggles` default on; a case turns one off to measure the reference behaviour.
    `threads` is torch's intra-op thread count while it is measured; None takes the
    platform's default (`perfguard.device.threads`: 1 on CPU). `output_may_change`
    lets the case's output differ from its baseline's without failing the check (a
    numerics change; `perfguard.decision.counters`).

    A `diffusers` case has no preset: it names a `save_pretrained` directory (`model`),
    its `prompt` (and `negative_prompt`) and, with `dit = "perfguard"`, swaps perfguard's
    DiT into the pipeline (the toggles then apply to it). Its fields go to the
    pipeline's `__call__` arguments of the same name (`steps` to `num_inference_steps`),
    `guidance_scale` only when the case sets it (else None: the pipeline's own default),
    and its `options` are further `__call__` arguments, passed as written
    (`perfguard.interop.diffusers.arguments.call_arguments`).

    A `server` case measures a server over HTTP (docs/serving.md): a running one at `url`
    or one perfguard starts from `launch` (an argv with `{port}`, ready when `GET
    /health` answers or its log shows `ready`). Each of `rounds` rounds sends `warmup`
    untimed requests, then `requests` requests at each level of `concurrency` (closed
    loop; Poisson arrivals at `rate` per second when set), each one `request` as its
    body to the `api` (`images` or `videos`). `perf_log` (sglang's `performance.log`)
    and `metrics` (Prometheus `/metrics`) add stage times where the server has them.
    """

    id: str
    workload: str
    preset: str = ""
    height: int = 64
    width: int = 64
    steps: int = 4
    batch: int = 1
    guidance_scale: float | None = 4.0
    serial_cfg: bool = True
    prompt_lengths: tuple[int, ...] = (16,)
    num_devices: int = 1
    dtype: str = "float32"
    seed: int = 0
    tags: tuple[str, ...] = ()
    description: str = ""
    estimated_time_s: float | None = None
    threads: int | None = None
    toggles: dict[str, bool] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    tolerance_overrides: dict[str, dict[str, float]] = field(default_factory=dict)
    output_may_change: bool = False
    model: str = ""
    prompt: str = ""
    negative_prompt: str | None = None
    dit: str = "diffusers"
    url: str = ""
    launch: tuple[str, ...] = ()
    ready: str = ""
    api: str = "images"
    request: dict[str, Any] = field(default_factory=dict)
    concurrency: tuple[int, ...] = (1,)
    requests: int = 16
    warmup: int = 2
    rate: float | None = None
    perf_log: str = ""
    metrics: bool = False
    rounds: int = 5
    ready_timeout_s: float = 300.0
    request_timeout_s: float = 120.0
    source: str = field(default="", compare=False)

    def __hash__(self) -> int:
        return hash(self.id)

    def toggle(self, name: str) -> bool:
        """Whether optimization `name` is on (default on)."""
        if name not in TOGGLES:
            raise KeyError(f"unknown optimization toggle {name!r}")
        return bool(self.toggles.get(name, True))

    @property
    def cfg(self) -> bool:
        """Classifier-free guidance runs a second (uncond) pass per step."""
        return self.guidance_scale is not None and self.guidance_scale > 1.0

    def with_toggles(self, **toggles: bool) -> Case:
        """A copy with some toggles set (used by A/B runs)."""
        for name in toggles:
            if name not in TOGGLES:
                raise PerfguardError(f"unknown toggle {name!r}: choose from {', '.join(TOGGLES)}")
        if toggles and self.workload == DIFFUSERS and self.dit != "perfguard":
            raise PerfguardError(
                f"case {self.id!r}: toggles: do not apply to a diffusers pipeline's own "
                'transformer (set dit = "perfguard")'
            )
        return replace(self, toggles={**self.toggles, **toggles})

    def definition(self) -> dict[str, Any]:
        """The case as plain data, without where it came from."""
        data = asdict(self)
        data.pop("source")
        data["prompt_lengths"] = list(self.prompt_lengths)
        data["tags"] = list(self.tags)
        if not self.output_may_change:  # the default: definitions stay as they were
            data.pop("output_may_change")
        if self.workload != DIFFUSERS:  # keep built-in cases' definitions as they were
            for key in ("model", "prompt", "negative_prompt", "dit"):
                data.pop(key)
        if self.workload != SERVER:
            for key in SERVER_FIELDS:
                data.pop(key)
        else:
            data["launch"], data["concurrency"] = list(self.launch), list(self.concurrency)
        return data

    def to_json(self) -> dict[str, Any]:
        return {**self.definition(), "source": self.source}


@cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema("case"))


def _json_path(parts: Iterable[Any]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(case)"


def parse_case(raw: dict[str, Any], source: str) -> Case:
    """Validate one `[[case]]` table and build the `Case`; errors name file, id and field."""
    case_id = raw.get("id", "?") if isinstance(raw, dict) else "?"
    errors = sorted(_validator().iter_errors(raw), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        where = _json_path(err.absolute_path)
        message = err.message
        if err.validator == "not" and err.schema == {"not": {}}:  # forbidden by the workload
            workload = raw.get("workload") if isinstance(raw, dict) else None
            message = f"does not apply to a {workload!r} case"
            if where == "toggles" and workload == DIFFUSERS:
                message += ' unless dit = "perfguard"'
        raise PerfguardError(f"{source}: case {case_id!r}: {where}: {message}")
    bad = _not_finite(raw)
    if bad is not None:
        raise PerfguardError(
            f"{source}: case {case_id!r}: {bad[0]}: {bad[1]} is not a finite number"
        )
    data = dict(raw)
    lengths = data.get("prompt_lengths")
    batch = data.get("batch", 1)
    if lengths is None:
        lengths = [16] * batch
    if len(lengths) != batch:
        raise PerfguardError(
            f"{source}: case {case_id!r}: prompt_lengths: has {len(lengths)} entries "
            f"but batch is {batch}"
        )
    data["prompt_lengths"] = tuple(lengths)
    data["tags"] = tuple(data.get("tags", ()))
    if data.get("workload") == SERVER:
        _server_fields(data, f"{source}: case {case_id!r}")
    if data.get("workload") == DIFFUSERS and "guidance_scale" not in data:
        # Not set: not passed, so the pipeline's own default applies (Flux's distilled
        # guidance 3.5, Qwen-Image's None), rather than perfguard's built-in 4.0.
        data["guidance_scale"] = None
    if data.get("options", {}).get("cuda_graph") and data.get("num_devices", 1) > 1:
        raise PerfguardError(
            f"{source}: case {case_id!r}: options.cuda_graph: not supported with num_devices > 1"
        )
    prior = data.get("options", {}).get("prior_tokens")
    if prior is not None:
        if data.get("workload") != "glm_image":
            raise PerfguardError(
                f"{source}: case {case_id!r}: options.prior_tokens: only GLM-Image samples "
                f"prior tokens, not {data.get('workload')}"
            )
        # The target grid's ids are the last ones sampled: at least one per grid cell.
        grid = (data.get("height", 1024) // 32) * (data.get("width", 1024) // 32)
        if prior < grid:
            raise PerfguardError(
                f"{source}: case {case_id!r}: options.prior_tokens: {prior} is fewer than "
                f"the {grid} tokens of the {data.get('height', 1024)}x"
                f"{data.get('width', 1024)} target grid"
            )
    return Case(**data, source=source)


def _server_fields(data: dict[str, Any], where: str) -> None:
    """A server case's fields as the `Case` holds them; what the schema cannot say is an
    error naming the field."""
    if bool(data.get("url")) == bool(data.get("launch")):
        raise PerfguardError(f"{where}: give exactly one of url (a running server) or launch")
    launch = data.get("launch") or []
    if launch and not any("{port}" in arg for arg in launch):
        raise PerfguardError(f"{where}: launch: no argument holds {{port}}")
    data["launch"] = tuple(launch)
    data["concurrency"] = tuple(data.get("concurrency", (1,)))


def _not_finite(raw: Any, where: str = "") -> tuple[str, float] | None:
    """The first `nan` / `inf` in a case table (TOML has both; the schema's `minimum`
    lets NaN through, since every comparison with it is false)."""
    if isinstance(raw, float) and not math.isfinite(raw):
        return where or "(case)", raw
    items = (
        raw.items() if isinstance(raw, dict) else enumerate(raw) if isinstance(raw, list) else ()
    )
    for key, value in items:
        found = _not_finite(
            value,
            f"{where}[{key}]"
            if isinstance(key, int)
            else (f"{where}.{key}" if where else str(key)),
        )
        if found is not None:
            return found
    return None


def read_file(path: Path) -> dict[str, Any]:
    """Parse one registry file strictly: at most `jsonio.MAX_BYTES`, UTF-8 without a BOM,
    valid TOML (which has no duplicate keys), only `platforms` and `[[case]]` at the top,
    and at least one case."""
    source = display_path(path)
    text = read_text(path, "case registry file")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PerfguardError(f"{source}: malformed TOML: {exc}") from exc
    except RecursionError as exc:
        raise PerfguardError(f"{source}: malformed TOML: nested too deep") from exc
    except ValueError as exc:  # an integer over Python's 4300-digit limit
        raise PerfguardError(f"{source}: malformed TOML: {exc}".split("; use sys.")[0]) from exc
    unknown = set(doc) - {"case", "platforms"}
    if unknown:
        raise PerfguardError(
            f"{source}: unknown top-level key(s) {', '.join(sorted(unknown))}: "
            "expected [[case]] tables and, outside common.toml and <platform>.toml, platforms"
        )
    tables = doc.get("case")
    if tables is None:
        raise PerfguardError(f"{source}: no [[case]] table (an empty registry file is an error)")
    if not isinstance(tables, list):
        raise PerfguardError(f"{source}: 'case' must be an array of tables ([[case]])")
    return doc


def file_platforms(path: Path, doc: dict[str, Any]) -> tuple[str, ...]:
    """The platforms the cases of `path` are for: all for `common.toml`, one for
    `<platform>.toml`, else the file's own `platforms = [...]` (required)."""
    source = display_path(path)
    implied = REGISTRY_PLATFORMS if path.stem == "common" else (path.stem,)
    if path.stem == "common" or path.stem in REGISTRY_PLATFORMS:
        if "platforms" in doc:
            raise PerfguardError(
                f"{source}: platforms: not allowed in {path.name}, whose name already says "
                f"{', '.join(implied)}"
            )
        return implied
    declared = doc.get("platforms")
    if declared is None:
        raise PerfguardError(
            f"{source}: platforms: missing; a registry file other than common.toml and "
            "<platform>.toml must declare the platforms its cases are for, e.g. "
            'platforms = ["cuda", "rocm"]'
        )
    if (
        not isinstance(declared, list)
        or not declared
        or not all(isinstance(p, str) and p in REGISTRY_PLATFORMS for p in declared)
    ):
        raise PerfguardError(
            f"{source}: platforms: {declared!r} is not a non-empty list of "
            f"{', '.join(REGISTRY_PLATFORMS)}"
        )
    return tuple(declared)


def load_file(path: Path, doc: dict[str, Any] | None = None) -> list[Case]:
    """Parse one registry file (`doc`: its TOML, when already read); a malformed file is
    one `PerfguardError` naming it."""
    doc = read_file(path) if doc is None else doc
    file_platforms(path, doc)
    source = display_path(path)
    return [parse_case(t, source) for t in doc["case"]]


def display_path(path: Path) -> str:
    """`path` relative to the working directory when under it (shorter, stable in reports)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def default_cases_dir() -> Path:
    """`$PERFGUARD_CASES`, else `./cases`, else the `cases/` beside the perfguard sources."""
    env = os.environ.get(ENV_CASES)
    if env:
        return Path(env)
    here = Path.cwd() / "cases"
    if here.is_dir():
        return here
    # perfguard/storage/cases.py -> the checkout's root, which holds cases/.
    return Path(__file__).resolve().parents[2] / "cases"


@dataclass(frozen=True)
class RegistryFiles:
    """The `*.toml` files of a registry directory, split by whether they apply."""

    read: tuple[Path, ...]
    other_platforms: tuple[Path, ...]
    docs: Mapping[Path, dict[str, Any]] = field(default_factory=dict, compare=False, repr=False)
    """The parsed TOML of the files that were opened (`read` and declared others)."""


def scan_registry(directory: Path, platform: str) -> RegistryFiles:
    """Which files of `directory` hold cases for `platform`; every other `*.toml` in it
    is one for another platform (an undeclared one is an error, see the module doc)."""
    read: list[Path] = []
    other: list[Path] = []
    docs: dict[Path, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.toml")):
        if not path.is_file():
            continue
        if path.stem in REGISTRY_PLATFORMS and path.stem != platform:
            other.append(path)  # its name says it is not for us: no need to open it
            continue
        docs[path] = read_file(path)
        applies = platform in file_platforms(path, docs[path])
        (read if applies else other).append(path)
    read.sort(key=lambda p: (p.stem != "common", p.stem != platform, p.name))
    return RegistryFiles(tuple(read), tuple(other), docs)


def registry_root(directory: str | os.PathLike[str] | None = None) -> Path:
    root = Path(directory) if directory is not None else default_cases_dir()
    if not root.is_dir():
        raise PerfguardError(f"{root}: case registry directory does not exist (see --cases)")
    return root


def load_registry(platform: str, directory: str | os.PathLike[str] | None = None) -> list[Case]:
    """All cases for `platform` from the registry `directory`, deduplicated by id."""
    root = registry_root(directory)
    scan = scan_registry(root, platform)
    files = scan.read
    if not files:
        raise PerfguardError(
            f"{root}: no case registry for platform {platform!r} "
            f"(expected common.toml, {platform}.toml or a file with platforms = [{platform!r}])"
        )
    by_id: dict[str, Case] = {}
    for path in files:
        for case in load_file(path, scan.docs[path]):
            seen = by_id.get(case.id)
            if seen is None:
                by_id[case.id] = case
            elif seen != case:
                raise PerfguardError(
                    f"case {case.id!r} is defined differently in {seen.source} and {case.source}"
                )
    return list(by_id.values())


@dataclass(frozen=True)
class Selection:
    """Which cases a command works on: the registry and the filters of `select`.

    `shard` (`K/N`) keeps one of N deterministic parts, balanced by expected time
    (`perfguard.measurement.shard`); None and empty filters select everything.
    """

    cases_dir: str | None = None
    case_ids: tuple[str, ...] = ()
    match: str | None = None
    tags: tuple[str, ...] = ()
    shard: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "case_ids", tuple(self.case_ids))
        object.__setattr__(self, "tags", tuple(self.tags))

    def of(self, cases: Sequence[Case]) -> list[Case]:
        """The cases that pass the id, match and tag filters (not the shard)."""
        return select(cases, self.case_ids, self.match, self.tags)

    def filter_results(self, results: Results) -> Results:
        """`selection`'s ids, match and tags applied to a results file (tags from each
        result's case); unknown ids and an empty selection are errors."""
        unknown = [i for i in self.case_ids if i not in results.cases]
        if unknown:
            raise PerfguardError(f"unknown case id(s) in the results: {', '.join(unknown)}")
        try:
            pattern = re.compile(self.match) if self.match else None
        except re.error as exc:
            raise PerfguardError(
                f"--match: invalid regular expression {self.match!r}: {exc}"
            ) from exc
        kept = {
            cid: r
            for cid, r in results.cases.items()
            if (not self.case_ids or cid in self.case_ids)
            and (pattern is None or pattern.search(cid))
            and (not self.tags or set(self.tags) & set(r.case.get("tags", ())))
        }
        if not kept:
            raise PerfguardError("no case of the results matches the selection")
        results.cases = kept
        return results


def select(
    cases: Sequence[Case],
    ids: Sequence[str] = (),
    match: str | None = None,
    tags: Sequence[str] = (),
) -> list[Case]:
    """Cases named by `ids` (each must exist), whose id matches `match`, with any of `tags`.

    The three filters combine with AND; an empty filter selects everything.
    """
    known = {c.id: c for c in cases}
    missing = [i for i in ids if i not in known]
    if missing:
        raise PerfguardError(
            f"unknown case id(s): {', '.join(missing)} (see `perfguard list-cases`)"
        )
    try:
        pattern = re.compile(match) if match else None
    except re.error as exc:
        raise PerfguardError(f"--match: invalid regular expression {match!r}: {exc}") from exc
    out = []
    for case in cases:
        if ids and case.id not in ids:
            continue
        if pattern and not pattern.search(case.id):
            continue
        if tags and not set(tags) & set(case.tags):
            continue
        out.append(case)
    return out
