/* A case's metrics over commits, one plot per metric, one line per hardware. For each
 * hardware: the tolerance band (improvement bound to bound) shaded, the baseline dashed,
 * the median with the run's min-max as error bars, points coloured by verdict. Change
 * points are dashed vertical lines labelled with their size. Hover shows the commit, date,
 * median, ratio and interval; a click opens the point's report. The plots in view are drawn
 * first, the others in the background (a page of 40 metrics x 1,000 reports stays usable
 * while it draws); body[data-complete] is set when every plot is drawn. */
"use strict";
(function () {
  const pg = window.perfguard;
  const data = pg.data("perfguard-series");
  const xs = data.x.map(pg.esc);
  const pending = new Map();
  let drawnCount = 0;

  function rgba(hex, alpha) {
    const n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + alpha + ")";
  }

  function hoverText(m, s, i) {
    const rep = data.reports[s.r[i]];
    return "<b>" + pg.esc(rep.c || "no commit") + "</b> " + pg.esc(rep.d) + "<br>" +
      pg.esc(s.key) + " · " + pg.esc(m.m) + "<br>" +
      "median " + pg.num(s.med[i], 3) + " " + pg.esc(m.unit) +
      " (min " + pg.num(s.lo[i], 3) + ", max " + pg.num(s.hi[i], 3) + ")<br>" +
      "baseline " + pg.num(s.base[i], 3) + ", bound " + pg.num(s.bound[i], 3) + "<br>" +
      "ratio " + pg.num(s.ratio[i], 3) + " [" + pg.num(s.rlo[i], 3) + ", " +
      pg.num(s.rhi[i], 3) + "] " + pg.pct(s.ratio[i]) + "<br>" +
      "verdict " + pg.esc(s.v[i]) + (rep.i ? "<br>injected " + pg.esc(rep.i) : "");
  }

  function draw(m) {
    const el = document.getElementById(m.div);
    if (!el || el.dataset.drawn) return;
    const traces = [];
    for (const s of m.series) {
      const colour = data.hw[s.hw].colour;
      const x = s.x.map((i) => xs[i]);
      const hasBand = s.bound.some((v) => v !== null);
      if (hasBand) {
        traces.push({
          type: "scatter", mode: "lines", x: x,
          y: s.ibound.map((v, i) => (v === null ? s.base[i] : v)),
          line: { width: 0, shape: "hvh" }, hoverinfo: "skip", showlegend: false,
          legendgroup: s.key,
        });
        traces.push({
          type: "scatter", mode: "lines", x: x, y: s.bound, fill: "tonexty",
          fillcolor: rgba(colour, 0.13), line: { width: 0, shape: "hvh" }, hoverinfo: "skip",
          name: pg.esc(s.key) + " band", legendgroup: s.key,
        });
      }
      traces.push({
        type: "scatter", mode: "lines", x: x, y: s.base, hoverinfo: "skip",
        line: { color: colour, width: 1, dash: "dash", shape: "hvh" },
        name: pg.esc(s.key) + " baseline", legendgroup: s.key,
      });
      traces.push({
        type: "scatter", mode: "lines+markers", x: x, y: s.med,
        name: pg.esc(s.key) + " median", legendgroup: s.key,
        line: { color: colour, width: 1.3 },
        // pass: the hardware's colour; any other verdict: its own (red, green, orange)
        marker: { size: 6, color: s.v.map((v) => (v === "pass" ? colour : pg.colour(v))),
                  line: { width: 0 } },
        error_y: {
          type: "data", symmetric: false, color: rgba(colour, 0.5), thickness: 1, width: 0,
          array: s.hi.map((v, i) => (v === null ? 0 : v - s.med[i])),
          arrayminus: s.lo.map((v, i) => (v === null ? 0 : s.med[i] - v)),
        },
        text: s.med.map((_, i) => hoverText(m, s, i)),
        customdata: s.r.map((r) => data.reports[r].h),
        hovertemplate: "%{text}<extra></extra>",
      });
    }
    const shapes = [];
    const annotations = [];
    for (const c of m.changes) {
      const colour = c.dir === "slower" ? "#d62728" : "#2ca02c";
      shapes.push({
        type: "line", xref: "x", yref: "paper", x0: xs[c.x], x1: xs[c.x], y0: 0, y1: 1,
        line: { color: colour, width: 1.5, dash: "dash" },
      });
      annotations.push({
        x: xs[c.x], xref: "x", y: 1, yref: "paper", yanchor: "bottom", showarrow: false,
        font: { color: colour, size: 11 },
        text: pg.pct(c.ratio) + " " + pg.esc(data.hw[c.hw].key) + " @ " + pg.esc((c.c || "?").slice(0, 10)),
      });
    }
    const layout = {
      height: 340, margin: { l: 70, r: 20, t: 30, b: 80 }, hovermode: "closest",
      xaxis: { type: "category", categoryorder: "array", categoryarray: xs,
               title: { text: "commit (oldest first)" }, tickangle: -45, automargin: true },
      yaxis: { title: { text: pg.esc(m.m) + (m.unit ? " (" + pg.esc(m.unit) + ")" : "") } },
      shapes: shapes, annotations: annotations,
      legend: { orientation: "h", y: -0.35 },
    };
    Plotly.newPlot(el, traces, layout, { displaylogo: false, responsive: true });
    el.on("plotly_click", (ev) => {
      const href = ev.points && ev.points[0] && ev.points[0].customdata;
      if (typeof href === "string" && /^reports\/[0-9a-f]+\.html$/.test(href)) {
        window.location.href = href;
      }
    });
    el.dataset.drawn = "1";
    drawnCount += 1;
    pg.drawn(drawnCount);
    if (drawnCount === data.metrics.length) document.body.dataset.complete = "1";
  }

  for (const m of data.metrics) pending.set(m.div, m);
  if (data.metrics.length === 0) document.body.dataset.complete = "1";
  const observer = new IntersectionObserver((entries) => {
    for (const e of entries) {
      if (e.isIntersecting && pending.has(e.target.id)) {
        const m = pending.get(e.target.id);
        pending.delete(e.target.id);
        observer.unobserve(e.target);
        draw(m);
      }
    }
  }, { rootMargin: "400px" });
  for (const m of data.metrics) {
    const el = document.getElementById(m.div);
    if (el) observer.observe(el);
  }
  function background() {
    const next = pending.keys().next();
    if (next.done) return;
    const m = pending.get(next.value);
    pending.delete(next.value);
    draw(m);
    setTimeout(background, 0);
  }
  // Hash links (#m-...) from the index: draw the target at once.
  if (location.hash && pending.has(location.hash.slice(1))) {
    const m = pending.get(location.hash.slice(1));
    pending.delete(m.div);
    draw(m);
  }
  setTimeout(background, 50);
})();
