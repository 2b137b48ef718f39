/* perfguard's pages: helpers shared by the report's forest plots and the history series.
 * Every string that comes from a report (case ids, metric names, commits, reasons) reaches
 * plotly through esc(): plotly renders a subset of HTML in labels and hover text, and an
 * escaped string is drawn as the text it is, its control and bidi characters shown. The
 * data is read from a JSON <script> block (type application/json, never executed) that
 * the page generator escaped for HTML. */
"use strict";
window.perfguard = (function () {
  const COLOURS = {
    regression: "#d62728",
    improvement: "#2ca02c",
    pass: "#1f77b4",
  };
  // The characters shown as escapes rather than obeyed (perfguard/presentation/escape.py,
  // CONTROLS): C0 and C1 controls, and the invisible and bidirectional formatting
  // characters (U+202E would reverse the label around it).
  const CONTROLS =
    /[\u0000-\u001f\u007f-\u009f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb]/g;
  const NAMED = { "\n": "\\n", "\r": "\\r", "\t": "\\t" };
  function shown(c) {
    if (NAMED[c]) return NAMED[c];
    const code = c.charCodeAt(0);
    return code < 0x100
      ? "\\x" + code.toString(16).padStart(2, "0")
      : "\\u" + code.toString(16).padStart(4, "0");
  }
  function esc(value) {
    return String(value === null || value === undefined ? "" : value)
      .replace(CONTROLS, shown)
      .replace(/&/g, "&amp;")
      .replace(/</g, "&lt;")
      .replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;");
  }
  function data(id) {
    return JSON.parse(document.getElementById(id).textContent);
  }
  function colour(verdict) {
    return COLOURS[verdict] || "#ff7f0e"; // missing, new, error, inconclusive: orange
  }
  function pct(ratio) {
    if (ratio === null || ratio === undefined) return "-";
    const p = (ratio - 1) * 100;
    return (p >= 0 ? "+" : "") + p.toFixed(1) + " %";
  }
  function num(value, digits) {
    return value === null || value === undefined ? "-" : Number(value).toFixed(digits);
  }
  function drawn(count) {
    document.body.dataset.drawn = String(count);
  }
  return { esc, data, colour, pct, num, drawn };
})();
