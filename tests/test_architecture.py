"""The layout's rules (docs/architecture.md): layers, no import cycles, no torch below
measurement, small modules, and a CLI reference (docs/cli.md) that is the click definitions'."""

from __future__ import annotations

import ast
import importlib.util
import itertools
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import click
import pytest

from perfguard.cli import cli, reference
from perfguard.results import CaseResult, Results
from perfguard.storage import baseline as store
from perfguard.storage import refresh
from perfguard.storage.reports import write_results

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "perfguard"


def _structure() -> Any:
    """benchmarks/structure.py, loaded by path: the house limits (600 lines a module, 800
    a model file; 60 lines and 8 parameters a function, unless its docstring says why)
    and the one way they are counted, which this test and the benchmark share."""
    path = ROOT / "benchmarks" / "structure.py"
    spec = importlib.util.spec_from_file_location("structure", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STRUCTURE = _structure()

# A module may import modules of its own rank or below, never above.
RANKS = {
    "perfguard": 0,
    "perfguard.errors": 0,
    "perfguard.metrics": 0,
    "perfguard.results": 0,
    "perfguard.decision": 1,
    "perfguard.storage": 2,
    "perfguard.presentation": 3,
    "perfguard.interop.sglang": 3,
    "perfguard.device": 4,
    "perfguard.workloads": 5,
    "perfguard.interop.diffusers": 6,
    "perfguard.measurement": 7,
    "perfguard.api": 8,
    "perfguard.cli": 9,
    "perfguard.pytest_plugin": 9,
    "perfguard.__main__": 9,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def rank(module: str) -> int:
    best = max((k for k in RANKS if module == k or module.startswith(k + ".")), key=len)
    return RANKS[best]


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The perfguard modules `path` imports at run time (anywhere, not under TYPE_CHECKING)."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking(node):
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("perfguard"))
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").startswith("perfguard")
        ):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in known else str(node.module))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m for m in out if m in known}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(path, known) - {name} for name, path in mods.items()}


def test_no_module_imports_a_layer_above_its_own() -> None:
    wrong = [
        f"{m} (rank {rank(m)}) imports {d} (rank {rank(d)})"
        for m, deps in sorted(graph().items())
        for d in sorted(deps)
        if rank(d) > rank(m)
    ]
    assert not wrong, "\n".join(wrong)


def test_there_is_no_import_cycle() -> None:
    g = graph()
    # Package __init__ modules are importers of their package, not a layer of their own.
    g = {m: {d for d in deps if not g.get(d) or not d.startswith(m)} for m, deps in g.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(g.get(m, ())):
            if state.get(d) == 1:
                return [*stack[stack.index(d) :], d]
            if d not in state and (cycle := visit(d)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, " -> ".join(cycle)


def test_no_module_is_over_the_size_limit() -> None:
    long = STRUCTURE.figures()["files"]
    assert not long, long


# The command line imports the library's commands (`api`), its presentation and the
# shared vocabulary, nothing below: what a command does is the library's. The console
# script's hand-off to the resident server is the one exception: it runs before any
# command is imported, so that a command forked from the server pays for no import.
CLI_MAY_IMPORT = ("perfguard.api", "perfguard.presentation", "perfguard.cli", "perfguard.errors",
                  "perfguard.metrics")  # fmt: skip
CLI_HAND_OFF = {("perfguard.cli", "perfguard.measurement.resident")}


def test_the_command_line_imports_only_the_library_commands_and_presentation() -> None:
    wrong = [
        f"{m} imports {d}"
        for m, deps in sorted(graph().items())
        if m == "perfguard.cli" or m.startswith("perfguard.cli.")
        for d in sorted(deps)
        if d != "perfguard"  # the version
        and not any(d == k or d.startswith(k + ".") for k in CLI_MAY_IMPORT)
        and (m, d) not in CLI_HAND_OFF
    ]
    assert not wrong, "\n".join(wrong)


def test_no_function_is_over_the_house_limits() -> None:
    """No function takes more than 8 parameters or spans more than 60 lines, unless its
    docstring says why."""
    found = STRUCTURE.figures()
    over = found["long"] + found["wide"]
    assert not over, "\n".join(over)


def test_each_test_module_stands_alone() -> None:
    """Tests share builders through tests/helpers.py, tests/fake_pipeline.py,
    tests/diffusers_zoo.py and conftest,
    never by importing another test module (whose collection would then run twice) or by
    editing sys.path."""
    shared = {
        "tests.helpers",
        "tests.fake_pipeline",
        "tests.pg_server",
        "tests.conftest",
        "tests.diffusers_zoo",
    }
    bad = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                local = name.startswith("tests.") or name.startswith("test_")
                if local and name not in shared:
                    bad.append(f"{path.name}:{node.lineno} imports {name}")
            func = node.func if isinstance(node, ast.Call) else None
            if (
                isinstance(func, ast.Attribute)
                and func.attr in ("insert", "append")
                and ast.unparse(func.value) == "sys.path"
            ):
                bad.append(f"{path.name}:{node.lineno} edits sys.path")
    assert not bad, bad


def test_the_baseline_and_verdict_modules_share_their_bands_through_one_module() -> None:
    g = graph()
    for user in ("perfguard.storage.baseline", "perfguard.decision.verdict"):
        assert "perfguard.decision.tolerances" in g[user]
    assert "perfguard.storage.baseline" not in g["perfguard.decision.verdict"]
    assert "perfguard.decision.verdict" not in g["perfguard.storage.baseline"]


# ---- the file commands without torch ----------------------------------------------------------

BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys

    class NoTorch(importlib.abc.MetaPathFinder):
        BLOCKED = ("torch", "torch_npu", "diffusers", "transformers", "accelerate")

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in self.BLOCKED:
                raise ImportError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, NoTorch())
    from perfguard.cli import main
    main(sys.argv[1:])
    """
)


def _result(case_id: str, ms: float) -> CaseResult:
    res = CaseResult(case_id=case_id, repeats=5, warmup=1, case={"id": case_id, "tags": ["x"]})
    for i in range(5):
        value = ms * (1 + 0.002 * i)
        res.samples.setdefault("e2e", []).append(value)
        res.samples.setdefault("stage:DenoisingStage", []).append(0.6 * value)
    return res


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    env = {"platform": "cpu", "hardware": "test-cpu", "torch": "n/a"}
    results = Results(environment=env, settings={"repeats": 5, "warmup": 1})
    results.cases = {"a": _result("a", 10.0), "b": _result("b", 20.0)}
    out = {"results": tmp_path / "results.json", "baseline": tmp_path / "base.json"}
    write_results(out["results"], results)
    base = store.new_baseline(env)
    for res in results.cases.values():
        base = base.with_scenario(res.case_id, refresh.scenario_from_result(res))
    store.save(out["baseline"], base)
    other = tmp_path / "other.json"
    store.save(other, base.with_scenario("b", refresh.scenario_from_result(_result("b", 30.0))))
    out["other"] = other
    return out


def blocked(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def test_the_file_commands_run_where_torch_cannot_be_imported(
    files: dict[str, Path], tmp_path: Path
) -> None:
    proof = blocked("env", cwd=tmp_path)  # measuring commands do need torch
    assert proof.returncode != 0 and "blocked in this test" in proof.stderr + proof.stdout

    report = tmp_path / "report.json"
    b, r, o = str(files["baseline"]), str(files["results"]), str(files["other"])
    steps = [
        (["judge", "--results", r, "--baseline", b, "--report", str(report)], 0),
        (["report", "render", str(report), "--format", "md"], 0),
        (["report", "render", str(report), "--format", "table"], 0),
        (["report", "render", str(report), "--format", "json"], 0),
        (["merge", str(report), "--out", str(tmp_path / "merged.json")], 0),
        (["baselines", "validate", b, o], 0),
        (["baselines", "show", b], 0),
        (["baselines", "diff", b, o, "--format", "md"], 0),
        (["baselines", "merge", b, "--out", str(tmp_path / "m.json")], 0),
        (["history", "add", str(report), "--db", str(tmp_path / "h.db"), "--commit", "c1"], 0),
        (["history", "show", "--db", str(tmp_path / "h.db"), "--json"], 0),
        (["history", "changes", "--db", str(tmp_path / "h.db")], 0),
    ]
    for args, code in steps:
        proc = blocked(*args, cwd=tmp_path)
        assert proc.returncode == code, (args, proc.stdout, proc.stderr)
    assert json.loads(report.read_text())["kind"] == "perfguard.report"


def test_check_of_an_sglang_performance_log_runs_without_torch(tmp_path: Path) -> None:
    from tests.helpers import H100, record, write_log

    base = tmp_path / "h100.json"
    proc = blocked("baselines", "import-sglang", str(H100), "--out", str(base), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = write_log(tmp_path / "performance.log", [record("qwen_image_t2i", s) for s in (1, 1.01)])
    proc = blocked("judge", "--sglang-perf-log", str(log), "--baseline", str(base), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---- the CLI reference (docs/cli.md) -------------------------------------------------------------


def test_the_cli_reference_is_the_click_definitions() -> None:
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    start, end = page.find(reference.BEGIN), page.find(reference.END)
    assert 0 <= start < end, "docs/cli.md has no generated CLI reference block"
    block = page[start : end + len(reference.END) + 1]
    assert block == reference.markdown(cli), (
        "docs/cli.md's CLI reference is out of date: run "
        "`python -m perfguard.cli.reference --write docs/cli.md`"
    )


def test_every_command_and_option_appears_in_its_own_row_of_the_reference() -> None:
    rows = {
        line.split("|")[1].strip().strip("`"): line
        for line in reference.markdown(cli).splitlines()
        if line.startswith("| `")
    }
    for path, command in reference._commands(cli, "perfguard"):
        row = rows[path]
        for param in command.params:
            if not isinstance(param, click.Option) or param.hidden:
                continue
            group = getattr(param, "group", None)
            if group and f"`[{group}]`" in row:
                row_of_group = rows[f"[{group}]"]
                assert re.search(re.escape(param.opts[0]) + r"[ `/]", row_of_group), (group, param)
            else:
                assert re.search(r"`" + re.escape(param.opts[0]) + r"[ `/]", row), (path, param)


@pytest.mark.parametrize(
    ("workflow", "job"), [("perf.yml", "report"), ("refresh-baselines.yml", "merge")]
)
def test_the_file_jobs_install_the_file_commands_dependencies_without_torch(
    workflow: str, job: str
) -> None:
    import yaml

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    measuring = {"torch", "diffusers", "transformers", "accelerate"}

    def name(requirement: str) -> str:
        return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()

    wanted = {name(r) for r in project["dependencies"] if "python_version" not in r} - measuring
    wanted |= {name(r) for r in project["optional-dependencies"]["history"]}
    steps = yaml.safe_load((ROOT / ".github/workflows" / workflow).read_text())["jobs"][job]
    script = next(s["run"] for s in steps["steps"] if "Install perfguard" in s.get("name", ""))
    installed = {
        w.lower()
        for line in script.splitlines()
        if "pip install" in line and "-e" not in line.split()
        for w in line.split()[line.split().index("install") + 1 :]
        if not w.startswith("-")
    }
    assert "--no-deps -e ." in script and installed == wanted, (installed, wanted)
    assert not installed & measuring


# ---- constants explain, docs/measurements/ remembers ---------------------------------------

MAX_CONSTANT_SENTENCES = 3


def _sentences(text: str) -> int:
    flat = re.sub(r"\s+", " ", text.strip())
    flat = re.sub(r"\b(e\.g|i\.e|etc|vs|cf|al)\.", r"\1", flat)
    return len([s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z(`*])", flat) if s.strip()])


def test_a_constants_docstring_says_what_it_is_in_at_most_three_sentences() -> None:
    """What a constant is and the figure that justifies it; its history belongs in the
    dated record under docs/measurements/."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        body = ast.parse(path.read_text(encoding="utf-8")).body
        for node, doc in itertools.pairwise(body):
            if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign):
                targets = [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            text = doc.value.value
            if not (names and names[0].isupper() and isinstance(text, str)):
                continue
            if (n := _sentences(text)) > MAX_CONSTANT_SENTENCES:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {names[0]}: {n}")
    assert not long, "\n".join(long)


def test_the_module_map_in_the_architecture_page_is_the_package() -> None:
    """docs/architecture.md draws every module of each layer; the drawing is the tree."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = page.split("The modules of each layer", 1)[1].split("```\n", 1)[1]
    block = block.split("```", 1)[0]
    drawn: set[str] = set()
    folder = ""
    for line in block.splitlines():
        words = line.split()
        if not line.startswith(" "):
            folder, words = words[1].rstrip("/"), words[2:]
        drawn |= {f"{folder}/{w}" for w in words}
    real = set()
    for path in PACKAGE.rglob("*.py"):
        name = path.relative_to(PACKAGE).with_suffix("").as_posix()
        if path.parent == PACKAGE:  # the bottom layer; the entry points are drawn above
            if name in ("errors", "metrics", "results"):
                real.add(f"perfguard/{name}")
        elif path.name != "__init__.py":
            real.add(name)
    assert drawn == real, (sorted(drawn - real), sorted(real - drawn))
