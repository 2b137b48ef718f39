"""One escaping function per output format: every string from a report goes through one.

A report is untrusted input: a pull request from a fork produces one, `merge` joins shards
from many runners, `history add` files them into an archive the whole team browses. So
each renderer builds its output from fixed text and the results of these functions, and
never puts a report's string anywhere else:

| where the string goes                  | function      |
|----------------------------------------|---------------|
| Markdown text (a line, a table cell)   | `md_text`     |
| Markdown code span (an op name)        | `md_code`, `md_cell_code` in a table |
| HTML text (an element's content)       | `html_text`   |
| HTML attribute value (double-quoted)   | `html_attr`   |
| JSON inside a `<script>` block         | `script_json` |
| the terminal (rich `Text`, markup)     | `console_text`, `rich_markup` |

Each of them first shows the characters that would otherwise act instead of being read
(`show_controls`): the C0 and C1 controls (a newline would end a table row or a code span,
an ESC starts a terminal sequence) and the invisible or bidirectional formatting
characters (U+202E RIGHT-TO-LEFT OVERRIDE reverses the text around it, so one hostile id
makes its neighbours read as something else). They are written as `\\n`, `\\x1b`,
`\\u202e`: visible, and inert.

No function marks its output with in-band characters (a sentinel a string could carry):
a line that mixes text and code is a sequence of parts (`Code` marks the code), and each
part is escaped for what it is (`md_parts`).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable
from typing import Any

from rich.markup import escape as _rich_escape

_INVISIBLE = (
    "\u0000-\u001f"  # C0 controls (newline, tab, ESC...)
    "\u007f-\u009f"  # DEL and the C1 controls
    "\u00ad"  # soft hyphen
    "\u061c"  # Arabic letter mark
    "\u180e"  # Mongolian vowel separator
    "\u200b-\u200f"  # zero-width space, joiners, left-to-right and right-to-left marks
    "\u2028-\u202e"  # line and paragraph separators, bidi embeddings and overrides
    "\u2060-\u2069"  # word joiner, invisible operators, bidi isolates
    "\ufeff"  # zero-width no-break space (byte order mark)
    "\ufff9-\ufffb"  # interlinear annotation controls
)
CONTROLS = re.compile(f"[{_INVISIBLE}]")
"""The characters `show_controls` writes as escapes."""

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _shown(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def show_controls(text: object) -> str:
    """`text` with every control and invisible formatting character written as an escape
    (`\\n`, `\\x1b`, `\\u202e`), so that it is seen rather than obeyed."""
    return CONTROLS.sub(_shown, "" if text is None else str(text))


def shorten(text: object, limit: int) -> str:
    """`show_controls(text)`, cut to `limit` characters with an ellipsis when longer: where
    a string is one of many (a page's navigation), not where it is the subject."""
    shown = show_controls(text)
    return shown if len(shown) <= limit else shown[: max(limit - 1, 1)] + "…"


# ---- Markdown (CommonMark and GitHub's tables) -------------------------------------------

_MD_PUNCT = re.compile(r"([\\`*_\[\]|~])")
_MD_ENTITIES = str.maketrans(
    {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "@": "&#64;", "#": "&#35;"}
)
_SPACES = re.compile(r"\s+")
_LIST_NUMBER = re.compile(r"^ ?\d+(?=[.)])")


def _inline(text: object) -> str:
    s = _SPACES.sub(" ", show_controls(text))
    return _MD_PUNCT.sub(r"\\\1", s.translate(_MD_ENTITIES))


def _no_block_start(s: str) -> str:
    """A backslash before what would start a list item or a heading at a line's start."""
    lead = len(s) - len(s.lstrip(" "))
    if s[lead : lead + 1] in ("-", "+", "="):
        return s[:lead] + "\\" + s[lead:]
    number = _LIST_NUMBER.match(s)
    return s if number is None else s[: number.end()] + "\\" + s[number.end() :]


def md_text(text: object) -> str:
    """`text` safe in a Markdown line or table cell: no markup, no HTML, no mentions.

    Controls are shown (a newline cannot start a block or end a table row) and runs of
    spaces become one (two before a line end would be a hard break); `& < > "` become
    entities (no HTML, so no `</details>` or `<script>`); `@` and `#` become entities (no
    mentions or issue links); `` \\ ` * _ [ ] | ~ `` get a backslash (no code spans,
    emphasis, links, images or extra table cells); a leading `-`, `+`, `=` or number
    gets one too (no list item or heading, should the text start a line).
    """
    return _no_block_start(_inline(text))


def md_code(text: object) -> str:
    """`text` as one CommonMark code span that no content can close or leave.

    The fence is one backtick longer than the longest run of backticks inside (a span
    closes only on a run of exactly its fence's length), padded with a space where the
    text starts or ends with a backtick or a space (CommonMark strips one space each side).
    Controls are shown first, so no newline reaches the span. Not for a table cell: GitHub
    splits cells on `|` even inside a span (use `md_text` there). Empty text is `md_text`.
    """
    s = show_controls(text)
    if not s.strip():
        return md_text(s)
    runs = [len(r) for r in re.findall(r"`+", s)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if s[0] in "` " or s[-1] in "` " else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def md_cell_code(text: object) -> str:
    """`text` as code in a GitHub table cell: a code span (`md_code`) unless it holds a `|`
    (GitHub splits cells on it even inside a span), then Markdown text (`md_text`)."""
    return md_text(text) if "|" in str(text) else md_code(text)


class Code(str):
    """A part of a line shown as code (an op name): `md_parts` puts it in a code span."""

    __slots__ = ()


def md_parts(parts: Iterable[str]) -> str:
    """A line made of parts: `Code` parts as code spans, the others as Markdown text."""
    return _no_block_start(
        "".join(md_code(p) if isinstance(p, Code) else _inline(p) for p in parts)
    )


def plain_parts(parts: Iterable[str]) -> str:
    """The same line as plain text (a terminal): every part with its controls shown."""
    return "".join(show_controls(p) for p in parts)


# ---- HTML ----------------------------------------------------------------------------------


def html_text(text: object) -> str:
    """`text` as the content of an HTML element: `& < > " '` as entities, controls shown."""
    return html.escape(show_controls(text), quote=True)


def html_attr(text: object) -> str:
    """`text` as a double-quoted HTML attribute value: quotes too as entities, controls shown.
    (The value must be one the attribute's meaning allows: a URL attribute also needs a
    URL built here, never one taken from a report.)"""
    return html.escape(show_controls(text), quote=True)


def script_json(data: Any) -> str:
    """`data` as JSON that is safe inside `<script type="application/json">`: no `<`, `>`
    or `&` survives (a `</script>` or `<!--` in a case id cannot close or change the
    block), every other non-ASCII character is a `\\u` escape (the bidi controls
    included), and so are the two line separators JavaScript reads as line ends. The
    data is exact: the page script reads back the very strings, and escapes them for
    display (`assets/common.js`, `esc`)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
    for char, code in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(char, code)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


# ---- the terminal --------------------------------------------------------------------------


def console_text(text: object) -> str:
    """`text` for a rich `Text` (printed as written, never parsed as markup): controls
    shown, so an ESC cannot start a terminal sequence (colours, links, cursor moves)."""
    return show_controls(text)


def rich_markup(text: object) -> str:
    """`text` inside a rich markup string: `[` escaped as rich wants, controls shown."""
    return _rich_escape(show_controls(text))


__all__ = [
    "CONTROLS",
    "Code",
    "console_text",
    "html_attr",
    "html_text",
    "md_cell_code",
    "md_code",
    "md_parts",
    "md_text",
    "plain_parts",
    "rich_markup",
    "script_json",
    "shorten",
    "show_controls",
]
