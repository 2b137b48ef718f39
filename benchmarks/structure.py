"""The code's structure in figures: modules over the size limit, functions over the
length and parameter limits (docs/architecture.md, "Rules the layout keeps");
`tests/test_architecture.py` holds the code to these figures with this file's rules.

    python benchmarks/structure.py [--list]

Model files (`perfguard/workloads/`) may be long, as diffusers' are (MODEL_FILE_LINES);
a function whose docstring says "Over the house limits because" and why (a model's
`__init__` / `forward` taking diffusers' signature) is not counted.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "perfguard"
FILE_LINES = 600
MODEL_FILE_LINES = 800
FUNCTION_LINES = 60
PARAMETERS = 8
MODELS = PACKAGE / "workloads"
EXEMPT = "Over the house limits because"


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """self/cls do not count; *args and **kwargs count one each."""
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    if positional and positional[0].arg in ("self", "cls"):
        positional = positional[1:]
    return len(positional) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)


def exempt(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """The docstring says why: "Over the house limits because" and a reason after it."""
    doc = ast.get_docstring(fn) or ""
    at = doc.find(EXEMPT)
    return at >= 0 and bool(doc[at + len(EXEMPT) :].strip(" .\n"))


def figures() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"files": [], "long": [], "wide": []}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT)
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > (MODEL_FILE_LINES if MODELS in path.parents else FILE_LINES):
            out["files"].append(f"{rel} {lines}")
        for fn in ast.walk(ast.parse(text)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or exempt(fn):
                continue
            span = (fn.end_lineno or fn.lineno) - fn.lineno + 1
            if span > FUNCTION_LINES:
                out["long"].append(f"{rel}:{fn.lineno} {fn.name} {span} lines")
            if (n := parameters(fn)) > PARAMETERS:
                out["wide"].append(f"{rel}:{fn.lineno} {fn.name} {n} parameters")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="name each place")
    args = parser.parse_args(argv)
    found = figures()
    titles = {
        "files": f"modules over {FILE_LINES} lines ({MODEL_FILE_LINES} in workloads/)",
        "long": f"functions over {FUNCTION_LINES} lines (not counting those that say why)",
        "wide": f"functions over {PARAMETERS} parameters (not counting those that say why)",
    }
    for key, title in titles.items():
        print(f"{len(found[key]):4d}  {title}")
        if args.list:
            for place in found[key]:
                print(f"        {place}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
