"""The code's structure in figures: modules over the size target, functions over the
length and parameter targets, and import cycles (docs/architecture.md, "Targets").

    python benchmarks/structure.py [--list]

Model files (`perfguard/workloads/`) may be long, as diffusers' are; their model
signatures (`__init__` / `forward` of an `nn.Module`) may take many parameters.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "perfguard"
FILE_LINES = 600
FUNCTION_LINES = 60
PARAMETERS = 8
MODELS = PACKAGE / "workloads"


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """self/cls do not count; *args and **kwargs count one each."""
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    if positional and positional[0].arg in ("self", "cls"):
        positional = positional[1:]
    return len(positional) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)


def model_signature(path: Path, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return MODELS in path.parents and fn.name in ("__init__", "forward")


def figures() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"files": [], "long": [], "wide": []}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT)
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > FILE_LINES and MODELS not in path.parents:
            out["files"].append(f"{rel} {lines}")
        for fn in ast.walk(ast.parse(text)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            span = (fn.end_lineno or fn.lineno) - fn.lineno + 1
            if span > FUNCTION_LINES:
                out["long"].append(f"{rel}:{fn.lineno} {fn.name} {span} lines")
            if (n := parameters(fn)) > PARAMETERS and not model_signature(path, fn):
                out["wide"].append(f"{rel}:{fn.lineno} {fn.name} {n} parameters")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="name each place")
    args = parser.parse_args(argv)
    found = figures()
    titles = {
        "files": f"modules over {FILE_LINES} lines (outside workloads/)",
        "long": f"functions over {FUNCTION_LINES} lines",
        "wide": f"functions over {PARAMETERS} parameters (outside model signatures)",
    }
    for key, title in titles.items():
        print(f"{len(found[key]):4d}  {title}")
        if args.list:
            for place in found[key]:
                print(f"        {place}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
