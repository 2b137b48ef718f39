"""The relative check's base revision: where its code is and what its perfguard can run.

Before anything is measured, a probe in the base's environment (a side worker,
`launch.SIDE_WORKER`, its `probe` request) says where perfguard (and the factory) is
imported from, its version, worker protocol and case fields, so that a base that cannot
run the head's cases fails with one line naming both versions, and a DIR that does not
provide the code under test fails instead of silently comparing the head with itself.
The cases come from the caller's registry: their definitions are sent to the base's
worker minus the fields it does not know when they hold their default
(`case_for_base`, `options_for_base`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfguard.errors import PerfguardError
from perfguard.measurement.checkout import commit_of
from perfguard.measurement.launch import child_environment
from perfguard.measurement.options import MeasureOptions
from perfguard.storage.cases import Case

PROBE_TIMEOUT_S = 300.0
"""How long importing the base's perfguard (and the factory) may take in the probe."""


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
    import_dir = _import_dir(directory, subdir)
    info = _probe(directory, import_dir, factory, env)
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


def _import_dir(directory: str | os.PathLike[str], subdir: str | None) -> Path:
    """Where the base's code is imported from: DIR, or its `--against-subdir`."""
    root = Path(directory)
    if not root.is_dir():
        raise PerfguardError(f"--against {directory}: no such directory")
    import_dir = root / subdir if subdir else root
    if not import_dir.is_dir():
        raise PerfguardError(f"--against-subdir {subdir}: {import_dir} is not a directory")
    return import_dir.resolve()


def _probe(
    directory: str | os.PathLike[str],
    import_dir: Path,
    factory: str | None,
    env: Mapping[str, str] | None,
) -> dict[str, Any]:
    """The side worker's `probe` reply in the base's environment (`side_worker.probe`)."""
    from perfguard.measurement.profiling import side_request

    where = str(import_dir)
    try:
        return side_request(
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
