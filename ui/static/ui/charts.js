// The charts of the work unit and dashboard pages, drawn with the vendored uPlot (a static file: the
// Content-Security-Policy allows no inline script). No build step.
//
// Each <figure data-chart data-src="..."> is one chart: its data is JSON from the ui app
// (ui.charts: the API's GetChartData, bucketed in SQL to the width asked for), read
//   * once when the page (or an htmx swap) shows it,
//   * on the event stream's "hello" (every (re)connection, once the server is subscribed: whatever
//     happened while it was away),
//   * on a "metrics" event of its work unit (new points, at most about one a second per work unit),
//     and once more METRICS_WINDOW_MS after the last such event, for the points the server's
//     coalescing held back (ui.live.publish_metrics). No timer runs while no points arrive.
// One read per chart at a time; an event during a read asks for one more read after it.
// The figure exposes what it shows: data-points (points drawn), data-loads (reads applied),
// data-events (metrics events heard). Every label is set with textContent.
(function () {
  "use strict";
  var METRICS_WINDOW_MS = 1250; // ui.live.METRICS_WINDOW_S (1 s) plus a margin
  var HEIGHT = 220;
  var PALETTE = ["#3556d4", "#d9480f", "#2b8a3e", "#ae3ec9", "#1098ad", "#e67700", "#c2255c", "#5c7cfa",
                 "#087f5b", "#862e9c"];

  function text(tag, cls, value) {
    var el = document.createElement(tag);
    if (cls) el.className = cls;
    if (value !== undefined) el.textContent = value;
    return el;
  }

  function alpha(hex, a) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16 & 255) + "," + (n >> 8 & 255) + "," + (n & 255) + "," + a + ")";
  }

  function distr(scale) { return scale === "log" ? 3 : scale === "symlog" ? 4 : 1; }

  function fmt(v) {
    if (v === null || v === undefined) return "—";
    var a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(3);
    return String(Math.round(v * 1e4) / 1e4);
  }

  // --- Layout: a LayoutSpec's grid, through CSS custom properties (CSSOM, which the CSP allows) ---

  function applyGrid(container, layout) {
    container.style.setProperty("--cols", String(layout.columns || 1));
  }

  function applyCell(el, col, row, span, height) {
    if (col) {
      el.style.setProperty("--gc", col + " / span " + (span || 1));
      el.style.setProperty("--gr", row + " / span " + (height || 1));
      el.classList.add("placed");
    }
  }

  function layoutPage(root) {
    root.querySelectorAll(".chart-grid[data-columns]").forEach(function (grid) {
      applyGrid(grid, { columns: Number(grid.getAttribute("data-columns")) || 1 });
    });
    root.querySelectorAll("figure[data-chart][data-col]").forEach(function (el) {
      applyCell(el, el.getAttribute("data-col"), el.getAttribute("data-row"), el.getAttribute("data-span"),
                el.getAttribute("data-height"));
    });
  }

  // --- Drawing ---

  function plotHeight(fig) {
    var cells = Number(fig.getAttribute("data-height")) || 1;
    return HEIGHT * cells + (cells - 1) * 60;
  }

  // The legend shows the hovered point's values, and the latest ones while the cursor is elsewhere.
  function latest(u, sidx) {
    var column = u.data[sidx] || [];
    for (var i = column.length - 1; i >= 0; i--) if (column[i] !== null && column[i] !== undefined) return column[i];
    return null;
  }

  function legendValue(format) {
    return function (u, v, sidx, idx) { return format(idx === null ? latest(u, sidx) : v); };
  }

  function timeText(v) {
    if (v === null) return "—";
    var d = new Date(v * 1000);
    return d.toISOString().slice(0, 19).replace("T", " ");
  }

  function linesOptions(plot, width, height) {
    var series = [{ label: plot.x_label || (plot.x === "time" ? "time" : "step"),
                    value: legendValue(plot.x === "time" ? timeText : function (v) { return v === null ? "—" : String(v); }) }];
    var bands = [];
    var data = [plot.xs];
    var hidden = [];
    plot.series.forEach(function (s, i) {
      var color = PALETTE[i % PALETTE.length];
      var line = { label: s.label, stroke: color, width: 1.6, spanGaps: true, value: legendValue(fmt),
                   points: { show: plot.xs.length <= 30, size: 5 } };
      var banded = s.lo && s.hi;
      var ribbon = plot.style === "ribbon" && banded; // a ribbon without a band is drawn as its line
      if (plot.style === "points" || s.style === "points") { line.paths = function () { return null; }; line.points = { show: true, size: 5, fill: color }; }
      if (plot.style === "area") line.fill = alpha(color, 0.12);
      if (plot.style === "bars") {
        line.paths = uPlot.paths.bars({ size: [0.8, 24], align: 0 });
        line.fill = alpha(color, plot.series.length > 1 ? 0.35 : 0.55);
        line.width = 1;
        line.points = { show: false };
      }
      if (ribbon) { line.paths = function () { return null; }; line.points = { show: false }; }
      series.push(line);
      data.push(s.y);
      if (banded && plot.style !== "bars") {
        var hi = series.length, lo = hi + 1;
        var edge = ribbon ? alpha(color, 0.6) : alpha(color, 0.25);
        series.push({ label: s.label + " max", stroke: edge, width: ribbon ? 1 : 0.5, points: { show: false } });
        series.push({ label: s.label + " min", stroke: edge, width: ribbon ? 1 : 0.5, points: { show: false } });
        data.push(s.hi, s.lo);
        bands.push({ series: [hi, lo], fill: alpha(color, ribbon ? 0.3 : 0.12) });
        hidden.push(hi, lo);
      }
    });
    var axis = { stroke: "#667085", grid: { stroke: "#eef0f4", width: 1 }, ticks: { stroke: "#e4e7ec", width: 1 },
                 font: "11px system-ui, sans-serif" };
    var opts = {
      width: width, height: height, series: series, bands: bands,
      padding: [10, 14, 0, 4],
      scales: { x: { time: plot.x === "time", distr: distr(plot.x_scale) }, y: { distr: distr(plot.y_scale) } },
      axes: [Object.assign({}, axis), Object.assign({ size: 56 }, axis)],
      legend: { show: true, live: true },
      cursor: { drag: { x: true, y: false }, points: { size: 6 } },
      hooks: { draw: [function (u) { referenceLines(u, plot); }],
               // A drag zooms in; live data then keeps that zoom until a double click resets it.
               setSelect: [function (u) { if (u.__xmc && u.select.width > 0) u.__xmc.zoomed = true; }] }
    };
    return { opts: opts, data: data, hidden: hidden };
  }

  function referenceLines(u, plot) {
    if (!plot.hlines.length && !plot.vlines.length) return;
    var ctx = u.ctx, box = u.bbox;
    ctx.save();
    ctx.strokeStyle = "#98a2b3";
    ctx.setLineDash([4, 4]);
    ctx.lineWidth = 1;
    plot.hlines.forEach(function (y) {
      var py = u.valToPos(y, "y", true);
      if (py >= box.top && py <= box.top + box.height) { ctx.beginPath(); ctx.moveTo(box.left, py); ctx.lineTo(box.left + box.width, py); ctx.stroke(); }
    });
    plot.vlines.forEach(function (x) {
      var px = u.valToPos(x, "x", true);
      if (px >= box.left && px <= box.left + box.width) { ctx.beginPath(); ctx.moveTo(px, box.top); ctx.lineTo(px, box.top + box.height); ctx.stroke(); }
    });
    ctx.restore();
  }

  function barsOptions(plot, series, index, width, height) {
    var color = PALETTE[index % PALETTE.length];
    var labels = plot.categories;
    var xs = labels.map(function (_, i) { return i; });
    var axis = { stroke: "#667085", grid: { stroke: "#eef0f4", width: 1 }, ticks: { stroke: "#e4e7ec", width: 1 },
                 font: "11px system-ui, sans-serif" };
    var opts = {
      width: width, height: height,
      padding: [10, 14, 0, 4],
      series: [{ label: plot.histogram ? "bin" : "category", value: function (u, v) { return v === null ? "" : labels[v] || ""; } },
               { label: series.label, stroke: color, fill: alpha(color, 0.55), width: 1,
                 paths: uPlot.paths.bars({ size: [0.7, 80] }), points: { show: false },
                 value: function (u, v) { return v === null ? "" : fmt(v); } }],
      scales: { x: { time: false, range: function () { return [-0.5, labels.length - 0.5]; } }, y: { distr: distr(plot.y_scale) } },
      axes: [Object.assign({ values: function (u, splits) { return splits.map(function (i) { return labels[i] !== undefined && Number.isInteger(i) ? labels[i] : ""; }); } }, axis),
             Object.assign({ size: 56 }, axis)],
      legend: { show: true, live: true },
      cursor: { drag: { x: false, y: false } }
    };
    return { opts: opts, data: [xs, series.y], hidden: [] };
  }

  function summaryTable(plot) {
    var table = text("table", "data summary");
    var head = table.createTHead().insertRow();
    // Over an experiment each row is one work unit's (its wid and job name first).
    (plot.units ? ["unit"] : []).concat(["metric", "latest", "min", "max", "mean", "step"]).forEach(function (h) {
      head.appendChild(text("th", "", h));
    });
    var body = table.createTBody();
    plot.rows.forEach(function (r) {
      var tr = body.insertRow();
      if (plot.units) tr.appendChild(text("td", "", r.unit));
      tr.appendChild(text("td", "", r.metric));
      [r.latest, r.min, r.max, r.mean].forEach(function (v) { tr.appendChild(text("td", "num", fmt(v))); });
      tr.appendChild(text("td", "num", String(r.step)));
    });
    return table;
  }

  // Each plot of a chart is one or more "panes" (a uPlot, or a summary table), keyed so that a new
  // read of the same shape only gives uPlot new data (setData) instead of building it again.
  function panes(plot) {
    if (plot.kind === "summary") return [{ key: "summary:" + plot.id, title: plot.title, plot: plot }];
    if (plot.kind === "bars") {
      if (!plot.series.length) return [{ key: "empty:" + plot.id, title: plot.title, plot: plot, empty: true }];
      return plot.series.map(function (s, i) {
        return { key: "bars:" + plot.id + ":" + i + ":" + plot.categories.length, title: plot.series.length > 1 ? plot.title + " · " + s.label : plot.title,
                 plot: plot, series: s, index: i };
      });
    }
    if (!plot.series.length) return [{ key: "empty:" + plot.id, title: plot.title, plot: plot, empty: true }];
    return [{ key: "lines:" + plot.id + ":" + plot.series.map(function (s) { return s.label + (s.lo ? "+band" : ""); }).join("|"),
              title: plot.title, plot: plot }];
  }

  function draw(fig, body) {
    var state = fig.__chart;
    var box = fig.querySelector("[data-plots]");
    var layout = body.layout || { kind: "wrap", columns: 1, cells: {} };
    box.className = "plots layout-" + layout.kind;
    applyGrid(box, { columns: body.plots.length > 1 ? layout.columns : 1 });
    var wanted = [];
    body.plots.forEach(function (plot) {
      panes(plot).forEach(function (pane) { wanted.push(pane); });
    });
    var keep = {};
    wanted.forEach(function (pane) { keep[pane.key] = true; });
    Object.keys(state.panes).forEach(function (key) {
      if (!keep[key]) {
        var old = state.panes[key];
        if (old.uplot) old.uplot.destroy();
        old.el.remove();
        delete state.panes[key];
      }
    });
    var height = plotHeight(fig);
    wanted.forEach(function (pane, order) {
      var have = state.panes[pane.key];
      if (!have) {
        var el = text("div", "plot");
        var cell = (layout.cells || {})[pane.plot.id];
        if (cell && body.plots.length > 1) applyCell(el, cell.column, cell.row, cell.width, cell.height);
        if (wanted.length > 1) el.appendChild(text("div", "plot-title", pane.title)); // one plot: the chart's title says it
        var canvas = text("div", "plot-canvas");
        el.appendChild(canvas);
        have = state.panes[pane.key] = { el: el, canvas: canvas, uplot: null };
      }
      box.appendChild(have.el); // in the order of the answer
      if (pane.empty) {
        have.canvas.replaceChildren(text("p", "muted plot-empty", "No points yet."));
        return;
      }
      if (pane.plot.kind === "summary") {
        have.canvas.replaceChildren(summaryTable(pane.plot));
        return;
      }
      var width = paneWidth(have);
      var built = pane.plot.kind === "bars" ? barsOptions(pane.plot, pane.series, pane.index, width, height)
                                            : linesOptions(pane.plot, width, height);
      if (have.uplot) {
        have.uplot.setData(built.data, !have.zoomed);
      } else {
        have.uplot = new uPlot(built.opts, built.data, have.canvas);
        have.uplot.__xmc = have;
        have.uplot.over.addEventListener("dblclick", function () { have.zoomed = false; });
        var rows = have.uplot.root.querySelectorAll(".u-legend .u-series");
        built.hidden.forEach(function (i) { if (rows[i]) rows[i].classList.add("band-edge"); });
      }
    });
  }

  // The pane's cell decides its width (ui.css: one column on a phone); uPlot gets it in pixels.
  function paneWidth(pane) { return Math.max(120, Math.floor(pane.canvas.clientWidth || pane.el.clientWidth || 300)); }

  function status(fig, message) {
    var el = fig.querySelector("[data-chart-status]");
    if (!el) return;
    el.textContent = message;
    el.hidden = !message;
  }

  function load(fig) {
    var state = fig.__chart;
    if (state.busy) { state.again = true; return; }
    state.busy = true;
    var box = fig.querySelector("[data-plots]");
    var width = Math.max(50, Math.min(4000, Math.round(box.clientWidth || fig.clientWidth || 600)));
    var src = fig.getAttribute("data-src");
    fetch(src + (src.indexOf("?") >= 0 ? "&" : "?") + "width=" + width,
          { credentials: "same-origin", headers: { Accept: "application/json" }, cache: "no-store" })
      .then(function (response) {
        if (response.status === 404) throw new Error("This chart is gone, or you may no longer read it.");
        if (!response.ok) throw new Error("Could not read the chart's data (HTTP " + response.status + ").");
        var kind = response.headers.get("Content-Type") || "";
        if (kind.indexOf("application/json") !== 0) throw new Error("Signed out: reload the page to sign in.");
        return response.json();
      })
      .then(function (body) {
        draw(fig, body);
        state.loads += 1;
        fig.setAttribute("data-points", String(body.points));
        fig.setAttribute("data-loads", String(state.loads));
        status(fig, body.points ? "" : "No points yet.");
      })
      .catch(function (error) { status(fig, error.message || "Could not draw the chart."); })
      .then(function () {
        state.busy = false;
        if (state.again) { state.again = false; load(fig); }
      });
  }

  function start(root) {
    if (typeof uPlot === "undefined") return;
    layoutPage(root);
    root.querySelectorAll("figure[data-chart]").forEach(function (fig) {
      if (fig.__chart) return;
      fig.__chart = { busy: false, again: false, loads: 0, events: 0, trailing: 0, panes: {} };
      load(fig);
    });
  }

  function all() { return Array.prototype.slice.call(document.querySelectorAll("figure[data-chart]")); }

  // Read now, and once more a window later: the writes the server's gate holds back committed
  // within a window of the message that closed it (or, for "hello", of one sent before the stream).
  function nowAndLater(state, read) {
    read();
    clearTimeout(state.trailing);
    state.trailing = setTimeout(read, METRICS_WINDOW_MS);
  }
  function refresh(fig) { nowAndLater(fig.__chart, function () { load(fig); }); }

  // The work unit page's Metrics section (ui/_metrics.html) asks the server for its contents on
  // "metrics-read": now and once more a window later, on each "metrics" event and on "hello", like the
  // charts. A metric that began inside the coalescing window of another's message, or while the stream
  // was away, gets its chart with them (no message of its own need come).
  var section = { trailing: 0 };
  function readSection() {
    var el = document.getElementById("metrics");
    if (el && el.hasAttribute("hx-get") && typeof htmx !== "undefined") htmx.trigger(el, "metrics-read");
  }
  function refreshSection() { nowAndLater(section, readSection); }

  function onMetrics(event) {
    var change;
    try { change = JSON.parse(event.data); } catch (e) { return; }
    refreshSection(); // the work unit page's stream carries only its own work unit's events
    all().forEach(function (fig) {
      if (!fig.__chart || Number(fig.getAttribute("data-xid")) !== change.xid ||
          Number(fig.getAttribute("data-wid")) !== change.wid) return;
      fig.__chart.events += 1;
      fig.setAttribute("data-events", String(fig.__chart.events));
      refresh(fig);
    });
  }

  // The pages' one event stream (htmx's SSE extension opens it): listen on it, never open another.
  document.addEventListener("htmx:sseOpen", function (event) {
    var source = event.detail && event.detail.source;
    if (!source || source.__xmcCharts || !/\/events(\?|$)/.test(source.url)) return; // not the logs' follow
    source.__xmcCharts = true;
    source.addEventListener("hello", function () {
      all().forEach(function (fig) { if (fig.__chart) refresh(fig); });
      refreshSection();
      document.body.setAttribute("data-stream", "ready"); // subscribed: from now on no change is missed
    });
    source.addEventListener("metrics", onMetrics);
    // A chart of more than one work unit follows the stream's event its data-follow names: "experiment"
    // (every change of the experiment), "study-<sid>" (a study's history: each committed trial change).
    var followed = {};
    all().forEach(function (fig) {
      var name = fig.getAttribute("data-follow");
      if (!name || followed[name]) return;
      followed[name] = true;
      source.addEventListener(name, function () {
        all().forEach(function (f) { if (f.__chart && f.getAttribute("data-follow") === name) refresh(f); });
      });
    });
  });

  document.addEventListener("DOMContentLoaded", function () { start(document); });
  // A swapped-in Metrics section (a work unit's first points) brings new charts.
  document.addEventListener("htmx:load", function (event) { if (event.target instanceof Element) start(event.target); });

  // Follow the page's width (a phone turned, a window resized): same data, new size.
  var resizing = 0;
  window.addEventListener("resize", function () {
    clearTimeout(resizing);
    resizing = setTimeout(function () {
      all().forEach(function (fig) {
        var state = fig.__chart;
        if (!state) return;
        Object.keys(state.panes).forEach(function (key) {
          var pane = state.panes[key];
          if (pane.uplot) pane.uplot.setSize({ width: paneWidth(pane), height: pane.uplot.height });
        });
      });
    }, 150);
  });
})();
