"""A report is untrusted input: every string in it is shown as text wherever it goes.

The hostile fixture is a real report (judged and written by the library) given every
optional section a report can hold, then every string in it that the schema lets be free
(values and keys) replaced by a hostile one: script tags, attribute breakers,
`</script>`, a code-span breaker (a newline, then raw HTML), control and bidi characters,
and 100 kB where the schema allows that much. It is then

- rendered to Markdown (`report render`, `merge --markdown`) and parsed with a real
  CommonMark renderer (markdown-it-py): no HTML element or attribute may appear that a
  clean report's rendering lacks, and no control character may reach the text;
- rendered to the terminal: no control character reaches it (an ESC would start a
  terminal sequence);
- rendered to the HTML report and the history site: the same element check on the HTML,
  every URL the page holds relative and inside its folder, and in Debian's chromium
  (tests/browser.py) no script run, no dialog, no request outside the page's folder.

Each checker is first shown a deliberately vulnerable input and must see it.
"""

from __future__ import annotations

import copy
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from perfguard.presentation import escape
from perfguard.presentation.escape import (
    CONTROLS,
    html_attr,
    html_text,
    md_code,
    md_text,
    show_controls,
)
from perfguard.storage.jsonio import schema, validate
from tests.helpers import history_report

PG = Any

# ---- the hostile strings -------------------------------------------------------------------

PAYLOAD = (
    "</script><script>alert(1)</script><img src=x onerror=alert(2)>\"'><svg onload=alert(3)>"
    "`a\n\n<img src=y onerror=alert(4)>` ``` <!-- [l](http://evil.example/) @team #1 *e* _u_ |"
    "\x00\x01\x1b[31m\u202e\u2066\u200b\u2028\\"
)
"""One string that tries each way out: of a script block, an attribute, a code span (the
newline), a comment, Markdown markup and a table cell; NUL and SOH (the old renderer's
code-span marks), an ESC sequence, and the bidi and invisible controls."""
assert len(PAYLOAD) < 190  # fits a name (200 characters) with a distinguishing suffix

LONG = PAYLOAD + "x" * 100_000
"""The payload at 100 kB, for fields whose schema allows free text that long."""

TINY = "</script><img src=x onerror=alert(5)>\u202e\n\x1b[0m"
"""A short payload, for fields of a few dozen characters (a date)."""

SHA = "0123456789abcdef0123456789abcdef01234567"


# ---- the fixture ---------------------------------------------------------------------------


def _metric(cls: str, unit: str, measured: float, base: float, verdict: str) -> dict[str, Any]:
    return {
        "class": cls,
        "unit": unit,
        "verdict": verdict,
        "measured": {"median": measured, "n": 1},
        "baseline": {"median": base, "n": 1},
        "band": {"rel": 0.0, "abs": 0.0},
        "bound": base,
        "ratio": measured / base if base else None,
        "delta": measured - base,
        "reason": f"{cls} moved",
    }


def clean_report(tmp: Path) -> dict[str, Any]:
    """A real report with every optional section a report can hold, as the library writes
    it (read back and written again through `Report`), with plain strings."""
    from perfguard.storage.reports import Report

    data = json.loads(history_report(tmp / "base-report.json", 23.0, seed=3).read_text())
    data["environment"] = {
        "platform": "cpu",
        "hardware": "test-cpu",
        "device_name": "cpu",
        "device_count": 1,
        "torch": "2.9.0+cpu",
        "versions": {"cuda": None, "driver": "570.1"},
        "python": "3.12.1",
        "perfguard": "0.1.0",
        "git_commit": SHA,
        "hostname": "runner-1",
        "os": "Linux 6.1",
        "cpu": "x86 cpu",
        "cpu_count": 2,
        "cpu_affinity": "0-1",
        "cpu_frequency": {"available": False, "reason": "no cpufreq (VM or container?)"},
        "gpu_clocks": {
            "available": True,
            "source": "nvml",
            "reason": "read through NVML",
            "gpus": [{"name": "gpu0", "sm": 1}],
        },
        "notes": ["a platform note"],
        "threads": {"default_intra_op": 2, "inter_op": 1, "override": None},
        "reference_workload": "abc123",
        "source": "sglang performance.log",
        "file": "perf.log",
        "commit_hash": ["abc", "def"],
    }
    data["baseline"].update(commit=SHA, hardware="test-cpu", updated="2026-01-01T00:00:00+00:00")
    data["settings"].update(inject="DenoisingStage=+50%", shard="1/2", factory="mod:fn")
    (cid,) = data["cases"]
    case = data["cases"][cid]
    case["metrics"]["ops:DenoisingStage"] = _metric("ops", "ops", 34, 10, "regression")
    case["metrics"]["syncs:DenoisingStage"] = _metric("syncs", "syncs", 1, 0, "regression")
    for m in case["metrics"].values():
        m["reason"] = m.get("reason") or "a reason"
    case.update(
        notes="a note",
        output_hash="abc",
        baseline_output_hash="abd",
        components={"transformer": {"class": "pkg.Transformer", "parameters": 1000}},
        baseline_components={"transformer": {"class": "pkg.Other", "parameters": 900}},
        arguments={"prompt": "a fox", "negative_prompt": None, "steps": 2, "sizes": [1, 2]},
        counters={"cache_hits": [1, 2]},
        work={
            "note": "a work note",
            "context": {"torch": "2.9.0", "device_type": "cpu", "dtype": "float32"},
            "baseline_context": {"torch": "2.9.0", "device_type": "cpu", "dtype": "float32"},
            "runs": 1,
            "steps": 0,
            "varies": ["syncs:DenoisingStage"],
            "op_changes": {"DenoisingStage": {"aten::addmm": [10, 34]}},
            "sync_changes": {"DenoisingStage": {"aten::nonzero": [0, 1]}},
        },
        output={"verdict": "changed", "allowed": False, "max_abs_diff": 0.5, "reason": "moved"},
    )
    if "observed" in schema("report")["$defs"]["case"]["properties"]:
        case["observed"] = {"no_steps": "the pipeline has no step seam"}
    failed = {"verdict": "error", "error": "it broke", "metrics": {}}
    data["cases"]["broken-case"] = failed
    data["settled"] = {
        "against": {
            "dir": "/base",
            "import_dir": "/base/src",
            "commit": SHA,
            "ref": "main",
            "perfguard_version": "0.1.0",
            "blocks": 4,
            "stopped": "done",
        },
        "settings": {"repeats": 3},
        "cases": {cid: copy.deepcopy(case)},
        "unresolved": {},
    }
    data["merged_from"] = [
        {
            "source": "shard-1.json",
            "created": "2026-01-01T00:00:00+00:00",
            "hostname": "runner-1",
            "git_commit": SHA,
            "cases": [cid, "broken-case"],
            "verdict": "fail",
            "exit_code": 1,
            "settings": {"shard": "1/2"},
        }
    ]
    if "attribution" in schema("report")["properties"]:
        data["attribution"] = _attribution(cid)
    out = Report.from_json(data).to_json()
    validate(out, "report", "the clean fixture")
    return out


def _attribution(cid: str) -> dict[str, Any]:
    """A per-op attribution section (perfguard.decision.attribution) of two cases."""
    side = {
        "label": "base",
        "dir": "/base",
        "commit": SHA,
        "perfguard": "0.1.0",
        "trace": "/traces/base.json",
        "activities": ["cpu"],
        "stages_ms": {"DenoisingStage": 1},
    }
    row = {
        "name": "aten::addmm",
        "shapes": "[[2, 3], [3, 4]]",
        "calls_base": 1,
        "calls_head": 2,
        "base_us": 50.0,
        "head_us": 100.0,
        "delta_us": 50.0,
        "noise_us": 2.0,
        "share": 1.0,
        "within_noise": False,
    }
    stage = {
        "stage": "DenoisingStage",
        "base_us": 100.0,
        "head_us": 150.0,
        "delta_us": 50.0,
        "noise_us": 5.0,
        "rows_total": 3,
        "rows": [row, {**row, "within_noise": True}],
    }
    ran = {"metrics": ["stage:DenoisingStage"], "sides": {"base": side, "head": side}}
    return {
        "version": 1,
        "unit": "us",
        "runs_per_side": 2,
        "noise": {"floor_share": 0.1, "floor_us": 5.0},
        "cases": {
            cid: {**ran, "stages": [stage]},
            "broken-case": {"metrics": [], "sides": {}, "stages": [], "error": "no base"},
        },
    }


_CASE_KEY_PARENTS = {
    ("cases",),
    ("settled", "cases"),
    ("settled", "unresolved"),
    ("attribution", "cases"),
}
"""Where a case id is a key: replaced together with its other places (one id, one case)."""

_LINKED_KEYS = {"op_changes", "sync_changes", "metrics"}
"""Objects whose keys name a stage or a metric (patterns, or links to the metrics)."""


def _strings(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], bool]]:
    """Every string in `doc`: (path, is_key); a key's path ends with the key."""
    out: list[tuple[tuple[Any, ...], bool]] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            if path not in _CASE_KEY_PARENTS and (not path or path[-1] not in _LINKED_KEYS):
                out.append(((*path, k), True))
            out += _strings(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _strings(v, (*path, i))
    elif isinstance(doc, str):
        out.append((path, False))
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def _error_paths(doc: dict[str, Any]) -> set[tuple[Any, ...]]:
    """The instance path of every schema error in `doc`, the sub-errors of `anyOf` too."""
    import jsonschema

    out: set[tuple[Any, ...]] = set()
    todo = list(jsonschema.Draft202012Validator(schema("report")).iter_errors(doc))
    while todo:
        err = todo.pop()
        out.add(tuple(err.absolute_path))
        todo += list(err.context or [])
    return out


def _dicts_at(doc: Any, depth: int, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if not isinstance(doc, (dict, list)):
        return []
    here = [path] if depth == 0 and isinstance(doc, dict) else []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc)
    if not depth:
        return here
    return here + [p for k, v in items for p in _dicts_at(v, depth - 1, (*path, k))]


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    _get(doc, path[:-1])[path[-1]] = value


_TYPED = {"environment", "settings", "against", "gpu_clocks", "profile", "baseline", "work",
          "attribution", "base", "head",
          "output", "runner", "sampling", "settled", "noise", "paired", "band", "measured",
          "observed", "cpu_frequency", "threads"}  # fmt: skip
"""Objects with named fields: the fields are kept and a hostile key is added beside them
(a free map, such as ops, roles or arguments, has its keys replaced instead)."""


def _typed(path: tuple[Any, ...]) -> bool:
    return (
        not path
        or path[-1] in _TYPED
        or (len(path) >= 2 and path[-2] in ("cases", "metrics", "merged_from", "unresolved"))
        or (len(path) >= 2 and path[-2] == "gpus")
    )


def hostile(clean: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`clean` with every free string replaced: the 100 kB payload where the schema takes
    it, else the payload (numbered, so keys stay distinct); strings the schema fixes
    (enums, patterns, hashes, commits) stay, as the schema's errors say. Case ids are
    replaced in all their places at once. Returns the report and the paths replaced."""
    doc = copy.deepcopy(clean)
    ids = {cid: f"{PAYLOAD} #{i}" for i, cid in enumerate(sorted(doc["cases"]))}
    for parent in _CASE_KEY_PARENTS:
        obj = _get(doc, parent) if parent[0] in doc else {}
        for cid in list(obj):
            obj[ids[cid]] = obj.pop(cid)
    for shard in doc.get("merged_from", []):
        shard["cases"] = [ids[c] for c in shard["cases"]]
    # Values: every one the payload at 100 kB; where the schema refuses it, the payload;
    # where it refuses that too, the clean value back.
    values = {p: _get(doc, p) for p, k in _strings(doc) if not k}
    values = {p: v for p, v in values.items() if not (p[0] == "merged_from" and "cases" in p)}
    tries = {
        p: [LONG, f"{PAYLOAD} {i}", f"{TINY}{i}", v] for i, (p, v) in enumerate(values.items())
    }
    for p in tries:
        _set(doc, p, tries[p].pop(0))
    for _ in range(4):
        bad = _error_paths(doc)
        for p in [p for p in tries if p in bad]:
            _set(doc, p, tries[p].pop(0))
    replaced = [".".join(map(str, p)) for p, left in tries.items() if left]
    # Keys, one depth at a time from the deepest (a renamed key moves no shallower path).
    n = 0
    for depth in range(12, -1, -1):
        renamed: dict[tuple[Any, ...], dict[Any, Any]] = {}
        for path in _dicts_at(doc, depth):
            if path in _CASE_KEY_PARENTS or (path and path[-1] in _LINKED_KEYS):
                continue
            obj = _get(doc, path)
            renamed[path] = dict(obj)
            n += 1
            if _typed(path):  # its fields stay; one more, hostile, beside them
                obj[f"{PAYLOAD} {n}"] = LONG
                continue
            items = list(obj.items())
            obj.clear()
            for _key, v in items:
                n += 1
                obj[f"{PAYLOAD} {n}"] = v
        for _ in range(2):
            bad = _error_paths(doc)
            # The document was valid before this depth: an error is one of its renames'.
            for path in [p for p in renamed if any(b[: len(p)] == p for b in bad)]:
                obj = _get(doc, path)
                obj.clear()
                obj.update(renamed.pop(path))
        replaced += [".".join(map(str, p)) + ".<key>" for p in renamed]
    assert not _error_paths(doc)
    return doc, [*replaced, "cases.<id>", "settled.cases.<id>", "merged_from.0.cases"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("hostile")
    clean = clean_report(tmp)
    bad, replaced = hostile(clean)
    from perfguard.storage.reports import Report

    # The verdict the cases give (read_report checks it): an id is only a key.
    bad = {**bad, **{k: Report.from_json(bad).to_json()[k] for k in ("verdict", "exit_code")}}
    (tmp / "clean.json").write_text(json.dumps(clean))
    (tmp / "hostile.json").write_text(json.dumps(bad))
    return {"dir": tmp, "clean": clean, "hostile": bad, "replaced": replaced}


def test_the_hostile_fixture_fills_every_free_string_with_the_payload(
    reports: dict[str, Any],
) -> None:
    """Every string field of the schema that takes free text holds the payload; the ones
    left are those the schema fixes (enums, hashes, metric names, commits)."""
    replaced = set(reports["replaced"])
    for must in (
        "environment.hostname",
        "environment.hardware",
        "environment.notes.0",
        "environment.gpu_clocks.gpus.0.name",
        "environment.versions.driver",
        "environment.commit_hash.0",
        "baseline.path",
        "profile.description",
        "settings.inject",
        "settled.against.dir",
        "merged_from.0.source",
    ):
        assert must in replaced, must
    doc = reports["hostile"]
    values = [_get(doc, p) for p, k in _strings(doc) if not k]
    assert sum(PAYLOAD in v for v in values) >= 40 and sum(v == LONG for v in values) >= 15
    keys = [p[-1] for p, k in _strings(doc) if k]
    assert sum(PAYLOAD in k for k in keys) >= 15
    left = [p for p, k in _strings(doc) if not k and TINY[:20] not in _get(doc, p)]
    left = [p for p in left if PAYLOAD not in _get(doc, p)]
    fixed = {"verdict", "kind", "class", "unit", "sha256", "git_commit", "commit", "source",
             "answer", "decision"}  # fmt: skip
    assert all(p[-1] in fixed for p in left), left
    # Every string property of the schema is in the fixture (a new field needs a place here).
    assert not _uncovered(reports["clean"]), _uncovered(reports["clean"])


def _uncovered(doc: dict[str, Any]) -> list[str]:
    """The string-holding properties of the report schema that `doc` leaves out."""
    root = schema("report")

    def resolve(s: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in s and len(s) <= 2:
            s = root["$defs"][s["$ref"].split("/")[-1]]
        return s

    def holds_string(s: dict[str, Any], seen: int = 0) -> bool:
        s = resolve(s)
        if seen > 4:
            return False
        t = s.get("type")
        if t == "string" or (isinstance(t, list) and "string" in t):
            return "enum" not in s and "const" not in s
        return any(holds_string(x, seen + 1) for x in s.get("anyOf", []) + s.get("oneOf", []))

    possible: set[str] = set()
    present: set[str] = set()

    def walk(s: dict[str, Any], value: Any, where: str) -> None:
        """A key of a free map reads `<*>`: a property counts as covered where any
        instance of it holds it."""
        s = resolve(s)
        for key, sub in s.get("properties", {}).items():
            has = isinstance(value, dict) and key in value
            if holds_string(sub):
                possible.add(f"{where}.{key}")
                if has:
                    present.add(f"{where}.{key}")
            if has and isinstance(value[key], dict):
                walk(sub, value[key], f"{where}.{key}")
            if has and isinstance(value[key], list) and isinstance(sub.get("items"), dict):
                for item in value[key]:
                    if isinstance(item, dict):
                        walk(sub["items"], item, f"{where}.{key}[]")
        extra = s.get("additionalProperties")
        if isinstance(extra, dict) and isinstance(value, dict):
            for k, v in value.items():
                if k not in s.get("properties", {}) and isinstance(v, dict):
                    walk(extra, v, f"{where}.<*>")

    walk(root, doc, "$")
    return sorted(m for m in possible - present if not m.startswith("$.against"))


# ---- Markdown ------------------------------------------------------------------------------


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: set[tuple[str, str]] = set()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.add((tag, ""))
        for name, value in attrs:
            self.found.add((tag, name))
            if name in ("href", "src", "action", "formaction", "data", "poster") and value:
                self.urls.append(value)

    handle_startendtag = handle_starttag


def html_markup(html: str) -> _Tags:
    parser = _Tags()
    parser.feed(html)
    parser.close()
    return parser


def md_markup(md: str) -> set[tuple[str, str]]:
    """The HTML elements and attributes a CommonMark renderer with GitHub's tables makes of
    `md`, raw HTML passed through (as GitHub passes some): what a reader's page would get."""
    from markdown_it import MarkdownIt

    renderer = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
    return html_markup(renderer.render(md)).found


def new_md_markup(md: str, clean_md: str) -> set[tuple[str, str]]:
    """What `md` renders to that `clean_md` does not: hostile markup that got through."""
    return md_markup(md) - md_markup(clean_md)


def test_the_markdown_checker_sees_markup_that_gets_through(reports: dict[str, Any]) -> None:
    """A checker that cannot see a vulnerable page would pass anything: shown the old
    renderer's output for an op name with a newline (the code span ends, the HTML after
    it is live) and a link, it names the element and its attributes."""
    clean = "- **c**: DenoisingStage: +24 `aten::add` per step\n"
    broken = "- **c**: DenoisingStage: +24 `aten::add\n\n<img src=x onerror=alert(1)>` per step\n"
    assert {("img", "src"), ("img", "onerror")} <= new_md_markup(broken, clean)
    assert ("a", "href") in new_md_markup(clean + "\n[x](http://evil.example/)\n", clean)
    assert not new_md_markup(clean, clean)


def _md(pg: PG, path: Path) -> str:
    code, out, err = pg("report", "render", str(path), "--format", "md")
    assert code == 0, err
    return out


def test_the_markdown_of_a_hostile_report_holds_no_markup_a_clean_one_lacks(
    reports: dict[str, Any], pg: PG, tmp_path: Path
) -> None:
    clean_md = _md(pg, reports["dir"] / "clean.json")
    md = _md(pg, reports["dir"] / "hostile.json")
    code, _, err = pg(
        "merge", str(reports["dir"] / "hostile.json"), "--out", str(tmp_path / "m.json"),
        "--markdown", str(tmp_path / "m.md"),
    )  # fmt: skip
    assert code == reports["hostile"]["exit_code"], err  # merge exits with the verdict's code
    merged = (tmp_path / "m.md").read_text()
    for text in (md, merged):
        assert not new_md_markup(text, clean_md)
        assert not CONTROLS.search(text.replace("\n", "")), "a control character got through"
        # Shown, not obeyed: the override and the ESC are there as escapes, the op name
        # whole in one code span, its newline as \n.
        assert "\\u202e" in text and "\\x1b" in text
    assert "What the code does" in md and "``" in md  # the op names' code spans
    # The renderer's sections are all there (the payload went through each of them).
    sections = ["#### Regressions", "#### Cases that failed to run", "<details>"]
    if "attribution" in reports["hostile"]:
        sections.append("#### Where the time went")
    for section in sections:
        assert section in md, section


def test_the_terminal_table_shows_control_characters(reports: dict[str, Any], pg: PG) -> None:
    code, out, err = pg("report", "render", str(reports["dir"] / "hostile.json"), "--format",
                        "table")  # fmt: skip
    assert code == 0, err
    assert "\x1b" not in out and "\u202e" not in out and "\x00" not in out
    assert "\\x1b[31m" in out


# ---- the escaping functions, on their own ---------------------------------------------------


def _inline_tokens(md: str) -> list[Any]:
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark", {"html": True}).enable(["table"]).parse(md)
    return [t for tok in tokens if tok.type == "inline" for t in tok.children or []]


@pytest.mark.parametrize(
    "text",
    [PAYLOAD, "`", "``", "a`b", " ` ", "`x`", "``` a ``` b ````", "a\nb", "  x  ", "\\", "|"],
)
def test_a_code_span_holds_its_text_whole_and_nothing_closes_it(text: str) -> None:
    (span,) = _inline_tokens(f"see {md_code(text)} here")[1:2]
    assert span.type == "code_inline" and span.content == show_controls(text)


@pytest.mark.parametrize("text", [PAYLOAD, "- item", "1. first", "+ x", "=", "# h", "<b>b</b>"])
def test_markdown_text_is_text_only(text: str) -> None:
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark", {"html": True}).enable(["table"]).parse(md_text(text))
    assert [t.type for t in tokens] == ["paragraph_open", "inline", "paragraph_close"]
    children = tokens[1].children or []
    assert {c.type for c in children} <= {"text"}
    expected = re.sub(r"\s+", " ", show_controls(text)).strip()
    assert "".join(c.content for c in children).strip() == expected


def test_html_text_and_attributes_read_back_as_the_shown_string() -> None:
    class Read(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.text, self.attr = "", ""

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.attr = dict(attrs)["title"] or ""

        def handle_data(self, data: str) -> None:
            self.text += data

    r = Read()
    r.feed(f'<p title="{html_attr(PAYLOAD)}">{html_text(PAYLOAD)}</p>')
    assert r.text == r.attr == show_controls(PAYLOAD)
    assert "\u202e" not in r.text and "\\u202e" in r.text and "\\n" in r.text


def test_controls_are_shown_as_escapes_and_nothing_is_marked_in_band() -> None:
    assert show_controls("a\u202eb\nc\x1bd\x00\u2066") == "a\\u202eb\\nc\\x1bd\\x00\\u2066"
    assert not CONTROLS.search(show_controls("".join(map(chr, range(0x2100)))))
    assert escape.script_json({"a": "\u202e</script>"}) == '{"a":"\\u202e\\u003c/script\\u003e"}'
    # No sentinel: NUL and SOH in a note are shown like any other control.
    assert md_text("a\x00b\x01c") == "a\\\\x00b\\\\x01c"


# ---- every command reads what one accepts, and refuses the same field -----------------------


def test_every_command_accepts_the_hostile_report(
    reports: dict[str, Any], pg: PG, tmp_path: Path
) -> None:
    path = str(reports["dir"] / "hostile.json")
    for fmt in ("md", "table"):
        code, _, err = pg("report", "render", path, "--format", fmt)
        assert code == 0, err
    code, _, err = pg(
        "report", "render", path, "--format", "html", "--out", str(tmp_path / "r.html")
    )
    assert code == 0, err
    code, _, err = pg("merge", path, "--out", str(tmp_path / "m.json"))
    assert code == reports["hostile"]["exit_code"], err
    db = str(tmp_path / "h.sqlite")
    for source in (path, str(tmp_path / "m.json")):  # the merged report too
        code, _, err = pg("history", "add", source, "--db", db, "--allow-injected")
        assert code == 0, err
    code, _, err = pg("history", "publish", "--db", db, "--out", str(tmp_path / "site"))
    assert code == 0, err


def _case(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["cases"][next(c for c in doc["cases"] if c != "broken-case")]


REFUSED = {
    "$.environment.git_commit": lambda d: d["environment"].update(git_commit=["a", "b"]),
    "$.environment.git_commit ": lambda d: d["environment"].update(git_commit="</script>"),
    "$.environment.hardware": lambda d: d["environment"].update(hardware="x" * 100_000),
    "$.environment.cpu_frequency": lambda d: d["environment"].update(cpu_frequency=[[[]]]),
    "$.environment.notes": lambda d: d["environment"].update(notes="one note"),
    "$.cases": lambda d: d["cases"].update({"x" * 100_000: d["cases"]["broken-case"]}),
    "$.cases.qwen_image_t2i_smoke.work.op_changes.DenoisingStage.aten::addmm": (
        lambda d: _case(d)["work"]["op_changes"]["DenoisingStage"].update({"aten::addmm": {}})
    ),
    "$.settled.against.commit": lambda d: d["settled"]["against"].update(commit={"a": 1}),
    "$.merged_from[0].git_commit": lambda d: d["merged_from"][0].update(git_commit=7),
}
"""A JSON path -> a change that puts a wrong shape there."""


@pytest.mark.parametrize("where", sorted(REFUSED))
def test_a_refused_report_names_its_field_in_every_command(
    where: str, reports: dict[str, Any], pg: PG, tmp_path: Path
) -> None:
    """render, merge and history add refuse the same report, naming the same field, in one
    line (before, `history add` blamed the archive for a list in environment.git_commit)."""
    doc = copy.deepcopy(reports["clean"])
    REFUSED[where](doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    db = tmp_path / "h.sqlite"
    for args in (
        ("report", "render", str(path), "--format", "md"),
        ("report", "render", str(path), "--format", "html", "--out", str(tmp_path / "r.html")),
        ("merge", str(path), "--out", str(tmp_path / "m.json")),
        ("history", "add", str(path), "--db", str(db), "--allow-injected"),
    ):
        code, _, err = pg(*args)
        line = err.strip().splitlines()[-1] if err.strip() else ""
        assert code == 2, (args, err[:500])
        assert f"{path}: {where.strip()}: " in line and len(line) < 1000, (args, line[:500])
        assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m.json").exists() and not (tmp_path / "r.html").exists()


# ---- HTML: the report page and the history site --------------------------------------------


def html_problems(page: Path, root: Path, clean: Path) -> list[str]:
    """What `page` holds that would act: an element or attribute its clean counterpart
    lacks, a URL with a scheme or leading `/`, or one that leaves `root`."""
    from urllib.parse import urlsplit

    found = html_markup(page.read_text(encoding="utf-8"))
    problems = [f"new markup {m}" for m in sorted(found.found - html_markup(
        clean.read_text(encoding="utf-8")).found)]  # fmt: skip
    for url in found.urls:
        parts = urlsplit(url)
        if parts.scheme or url.startswith(("/", "\\")) or parts.netloc:
            problems.append(f"URL {url[:80]!r} leaves the site")
        elif parts.path and not (page.parent / parts.path).resolve().is_relative_to(root):
            problems.append(f"URL {url[:80]!r} leaves {root}")
    return problems


_VULNERABLE = (
    '<img src=x onerror="alert(1)"><a href="javascript:alert(2)">x</a>'
    '<script src="../../../outside.js"></script><iframe src="https://evil.example/"></iframe>'
)
"""What a page whose escaping failed would hold: a handler, a script URL, a script from
outside the folder, a frame from the internet."""


def test_the_html_checker_sees_a_vulnerable_page(tmp_path: Path) -> None:
    clean = tmp_path / "clean.html"
    clean.write_text("<!DOCTYPE html><html><body><p>x</p></body></html>")
    bad = tmp_path / "bad.html"
    bad.write_text(f"<!DOCTYPE html><html><body><p>x</p>{_VULNERABLE}</body></html>")
    problems = "\n".join(html_problems(bad, tmp_path, clean))
    for expected in ("('img', 'onerror')", "javascript:alert", "outside.js", "evil.example"):
        assert expected in problems
    assert not html_problems(clean, tmp_path, clean)


@pytest.fixture(scope="module")
def pages(reports: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The HTML report and the history site of the clean and of the hostile report."""
    from perfguard.presentation import site
    from perfguard.presentation.html import render_report_html
    from perfguard.storage.archive import add_reports
    from perfguard.storage.reports import read_report

    out: dict[str, Any] = {}
    for kind in ("clean", "hostile"):
        tmp = tmp_path_factory.mktemp(f"pages-{kind}")
        src = reports["dir"] / f"{kind}.json"
        (tmp / "report").mkdir()
        report_page = tmp / "report" / "r.html"
        report_page.write_text(render_report_html(read_report(src)), encoding="utf-8")
        db = tmp / "h.sqlite"
        add_reports(db, [src], allow_injected=True)
        site.publish(db, tmp / "site")
        out[kind] = {"report": report_page, "site": tmp / "site"}
    return out


def _site_pages(root: Path) -> list[Path]:
    return [root / "index.html", *sorted(root.glob("case-*.html")), *sorted(
        (root / "reports").glob("*.html"))]  # fmt: skip


def test_the_hostile_pages_hold_no_markup_and_no_url_a_clean_one_lacks(
    pages: dict[str, Any],
) -> None:
    clean, bad = pages["clean"], pages["hostile"]
    assert not html_problems(bad["report"], bad["report"].parent, clean["report"])
    clean_pages = {p.name.split("-")[0]: p for p in _site_pages(clean["site"])}
    for page in _site_pages(bad["site"]):
        counterpart = (
            clean_pages.get(page.name.split("-")[0])
            or clean_pages[
                next(n for n in clean_pages if n.endswith(".html") and n != "index.html")
            ]
        )
        assert not html_problems(page, bad["site"], counterpart), page
        text = page.read_text(encoding="utf-8")
        assert not CONTROLS.search(text.replace("\n", "")), page
    # Names: every file the site wrote is inside it, named by a slug or a hash.
    for path in bad["site"].rglob("*"):
        rel = path.relative_to(bad["site"])
        assert all(re.fullmatch(r"[A-Za-z0-9_.-]+", part) for part in rel.parts), rel


def test_long_ids_are_shortened_in_navigation_and_whole_on_their_own_page(
    tmp_path: Path,
) -> None:
    """A 100 kB case id (an archive written before the schema's bound) is not printed on
    every page: the navigation, the index and its tables show its start and the hash of
    its page; its own page shows it whole."""
    from perfguard.presentation import site
    from perfguard.storage.archive import ReportRecord, add_records

    def record(i: int, case: str) -> ReportRecord:
        row = (case, "e2e", 5, 20.0, 0.1, 19.8, 20.2, 20.0, 1.0, "pass", 21.0, 18.0, 0.99,
               1.01, None)  # fmt: skip
        return ReportRecord(
            content_hash=f"{i:064x}", source=f"r{i}.json", git_commit=f"{i:04d}abcdef",
            date=f"2026-06-0{i + 1}T00:00:00+00:00", platform="cuda", hardware="h100",
            profile="long_term", verdict="pass", inject=None, environment={}, rows=[row],
        )  # fmt: skip

    db = tmp_path / "h.sqlite"
    long_id = "\u202e" + "a" * 100_000
    add_records(db, [record(i, case) for i, case in enumerate((long_id, "b", long_id, "b"))])
    site.publish(db, tmp_path / "site")
    index = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert len(index) < 20_000 and "\u202e" not in index
    assert site.short_id(long_id) in index and "\\u202eaaaa" in site.short_id(long_id)
    own = (tmp_path / "site" / f"case-{site.slug(long_id)}.html").read_text(encoding="utf-8")
    assert f"<h1>\\u202e{'a' * 100_000}</h1>" in own
    other = (tmp_path / "site" / f"case-{site.slug('b')}.html").read_text(encoding="utf-8")
    assert len(other) < len(own) - 90_000


# ---- in the browser ------------------------------------------------------------------------

_DRAWN = (
    "document.readyState === 'complete' && (document.body.dataset.drawn !== undefined"
    " || document.body.dataset.complete === '1' || !document.querySelector('div.plot'))"
)
_LIVE = """() => ({
  handlers: [...document.querySelectorAll('*')].filter(
    (e) => [...e.attributes].some((a) => a.name.startsWith('on'))).length,
  scripts: document.querySelectorAll('script').length,
  frames: document.querySelectorAll('iframe, object, embed, frame, base, form').length,
  images: document.querySelectorAll('body img').length,
})"""


def inspect(chromium: Any, page: Path, root: Path) -> dict[str, Any]:
    """`page` opened in chromium: what ran (dialogs), what it asked for outside `root`,
    its errors, and the live elements that could act (handlers, scripts, frames)."""
    from browser import visit

    v = visit(chromium, page.as_uri(), root=root)
    v.page.wait_for_function(_DRAWN, timeout=60_000)
    v.page.wait_for_timeout(300)
    live = v.page.evaluate(_LIVE)
    v.page.close()
    return {"dialogs": v.dialogs, "outside": v.outside, "errors": v.errors, **live}


@pytest.mark.browser
def test_the_browser_checker_sees_a_vulnerable_page(tmp_path: Path, chromium: Any) -> None:
    (tmp_path / "site").mkdir()
    page = tmp_path / "site" / "bad.html"
    page.write_text(
        "<!DOCTYPE html><html><body><p>x</p>"
        + _VULNERABLE.replace("<iframe", '<img src="../outside.png"><iframe')
        + "</body></html>"
    )
    found = inspect(chromium, page, tmp_path / "site")
    assert found["dialogs"] == ["1"], found
    assert any("outside.js" in u for u in found["outside"]), found
    assert any("outside.png" in u for u in found["outside"]), found
    assert any("evil.example" in u for u in found["outside"]), found
    assert found["handlers"] == 1 and found["frames"] == 1 and found["images"] == 2


@pytest.mark.browser
def test_the_hostile_pages_in_chromium_run_nothing_and_request_nothing_outside(
    pages: dict[str, Any], chromium: Any
) -> None:
    clean, bad = pages["clean"], pages["hostile"]
    pairs = [(bad["report"], bad["report"].parent, clean["report"], clean["report"].parent)]
    clean_site = {p.name.split("-")[0]: p for p in _site_pages(clean["site"])}
    for page in _site_pages(bad["site"]):
        key = page.name.split("-")[0]
        pairs.append((page, bad["site"], clean_site.get(key, page), clean["site"]))
    for page, root, counterpart, clean_root in pairs:
        found = inspect(chromium, page, root)
        expected = inspect(chromium, counterpart, clean_root)
        assert not found["dialogs"] and not found["outside"] and not found["errors"], (page, found)
        for key in ("handlers", "scripts", "frames", "images"):
            assert found[key] == expected[key], (page, key, found, expected)
