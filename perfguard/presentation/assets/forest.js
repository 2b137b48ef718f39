/* A forest plot per case: each metric's ratio (median / baseline) as a point with its
 * confidence interval, over the tolerance band it was judged against (shaded), the line at
 * 1.0, regressions in red. The axis is linear in the ratio, so +17 % reads as 1.17, which
 * log-scale bars of absolute times hide. */
"use strict";
(function () {
  const pg = window.perfguard;
  const report = pg.data("perfguard-report");
  let count = 0;
  for (const c of report.cases) {
    const el = document.getElementById(c.div);
    const rows = c.rows.filter((r) => r.ratio !== null);
    if (!el || rows.length === 0) continue;
    const labels = rows.map((r) => pg.esc(r.metric));
    const shapes = [];
    rows.forEach((r, i) => {
      if (r.band_high === null) return;
      shapes.push({
        type: "rect", xref: "x", yref: "y", layer: "below", line: { width: 0 },
        x0: r.band_low === null ? 1 : r.band_low, x1: r.band_high,
        y0: i - 0.38, y1: i + 0.38, fillcolor: "rgba(127,127,127,0.18)",
      });
    });
    shapes.push({
      type: "line", xref: "x", yref: "paper", x0: 1, x1: 1, y0: 0, y1: 1,
      line: { color: "#555", width: 1, dash: "dot" },
    });
    const text = rows.map((r) =>
      "<b>" + pg.esc(r.metric) + "</b><br>" +
      "median " + pg.num(r.median, 3) + " " + pg.esc(r.unit) +
      " (baseline " + pg.num(r.baseline, 3) + ")<br>" +
      "ratio " + pg.num(r.ratio, 3) + " [" + pg.num(r.low, 3) + ", " + pg.num(r.high, 3) + "]" +
      " " + pg.pct(r.ratio) + "<br>" +
      "band " + pg.num(r.band_low, 3) + " to " + pg.num(r.band_high, 3) + "<br>" +
      "verdict " + pg.esc(r.verdict) + (r.reason ? "<br>" + pg.esc(r.reason).slice(0, 200) : ""));
    const trace = {
      type: "scatter", mode: "markers", x: rows.map((r) => r.ratio), y: labels,
      marker: { size: 9, color: rows.map((r) => pg.colour(r.verdict)) },
      error_x: {
        type: "data", symmetric: false,
        array: rows.map((r) => (r.high === null ? 0 : r.high - r.ratio)),
        arrayminus: rows.map((r) => (r.low === null ? 0 : r.ratio - r.low)),
        color: "#444", thickness: 1.2, width: 3,
      },
      text: text, hovertemplate: "%{text}<extra></extra>", name: "ratio",
    };
    const layout = {
      title: { text: pg.esc(c.id) + " (" + pg.esc(c.verdict) + ")" },
      height: 120 + 24 * rows.length, margin: { l: 220, r: 30, t: 50, b: 50 },
      xaxis: { title: { text: "median / baseline (1.0 = baseline; grey: tolerance band)" },
               zeroline: false },
      yaxis: { type: "category", autorange: "reversed", automargin: true },
      shapes: shapes, showlegend: false, hovermode: "closest",
    };
    Plotly.newPlot(el, [trace], layout, { displaylogo: false, responsive: true });
    el.dataset.points = String(rows.length);
    count += 1;
  }
  pg.drawn(count);
})();
