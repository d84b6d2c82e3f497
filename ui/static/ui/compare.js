// The compare view's parallel coordinates (ui/templates/ui/compare.html), own canvas code, no library.
// One vertical axis per varying argument and metric (numbers on a linear scale, or log with "scale": "log"; other values spread
// as categories), one polyline per work unit. Dragging along an axis keeps the units whose value lies
// in that range (a brush per axis, all must hold); the table #compare-units hides the other rows and
// the canvas says how many remain in data-brushed (the table is the canvas's data-table, else #compare-units). A click without a drag clears that axis's brush.
(function () {
  "use strict";
  var PAD_X = 60, PAD_TOP = 28, PAD_BOTTOM = 20, HEIGHT = 300;

  function setup(canvas) {
    // The data: a JSON script named by data-parallel, or (a live fragment: htmx drops the scripts of what
    // it swaps in) the JSON in data-parallel-json.
    var inline = canvas.getAttribute("data-parallel-json");
    var source = inline ? null : document.getElementById(canvas.getAttribute("data-parallel"));
    if (!inline && !source) return;
    var data = JSON.parse(inline || source.textContent);
    var axes = data.axes.map(function (axis, i) {
      var values = data.units.map(function (u) { return u.values[i]; });
      var numeric = values.every(function (v) { return v === null || v === "" || !isNaN(Number(v)); });
      var out = { name: axis.name, numeric: numeric, brush: null };
      if (numeric) {
        var nums = values.filter(function (v) { return v !== null && v !== ""; }).map(Number);
        // A log axis (a study's log-uniform parameter: "scale": "log") is drawn in log10 space.
        out.log = axis.scale === "log" && nums.every(function (v) { return v > 0; });
        if (out.log) nums = nums.map(Math.log10);
        out.min = nums.length ? Math.min.apply(null, nums) : 0;
        out.max = nums.length ? Math.max.apply(null, nums) : 1;
        if (out.min === out.max) { out.min -= 1; out.max += 1; }
      } else {
        out.categories = Array.from(new Set(values.map(String))).sort();
      }
      return out;
    });
    var state = { canvas: canvas, data: data, axes: axes, drag: null };
    canvas.__parallel = state;

    function size() {
      var width = Math.max(320, canvas.parentElement.clientWidth - 2);
      var ratio = window.devicePixelRatio || 1;
      canvas.width = width * ratio; canvas.height = HEIGHT * ratio;
      canvas.style.setProperty("width", width + "px"); canvas.style.setProperty("height", HEIGHT + "px");
      state.width = width; state.ratio = ratio;
    }
    function axisX(i) { return axes.length === 1 ? state.width / 2 : PAD_X + i * (state.width - 2 * PAD_X) / (axes.length - 1); }
    function fraction(axis, value) { // 0 at the bottom, 1 at the top; null for a missing value
      if (value === null || value === "") return null;
      if (axis.numeric) return ((axis.log ? Math.log10(Number(value)) : Number(value)) - axis.min) / (axis.max - axis.min);
      var n = axis.categories.length;
      return n === 1 ? 0.5 : axis.categories.indexOf(String(value)) / (n - 1);
    }
    function y(f) { return PAD_TOP + (1 - f) * (HEIGHT - PAD_TOP - PAD_BOTTOM); }
    function kept(unit) {
      return axes.every(function (axis, i) {
        if (!axis.brush) return true;
        var f = fraction(axis, unit.values[i]);
        return f !== null && f >= axis.brush[0] - 1e-9 && f <= axis.brush[1] + 1e-9;
      });
    }
    function label(axis, f) {
      if (axis.numeric) {
        var v = axis.min + f * (axis.max - axis.min);
        if (axis.log) { v = Math.pow(10, v); return v < 1e-3 ? v.toExponential(1) : String(Number(v.toPrecision(3))); }
        return String(Math.round(v * 1e4) / 1e4);
      }
      return "";
    }
    function draw() {
      var ctx = canvas.getContext("2d");
      ctx.setTransform(state.ratio, 0, 0, state.ratio, 0, 0);
      ctx.clearRect(0, 0, state.width, HEIGHT);
      var keep = 0;
      data.units.forEach(function (unit) {
        var on = kept(unit);
        if (on) keep += 1;
        ctx.strokeStyle = on ? "rgba(53, 86, 212, 0.75)" : "rgba(152, 162, 179, 0.25)";
        ctx.lineWidth = on ? 1.6 : 1;
        ctx.beginPath();
        var started = false;
        axes.forEach(function (axis, i) {
          var f = fraction(axis, unit.values[i]);
          if (f === null) { started = false; return; }
          if (started) ctx.lineTo(axisX(i), y(f)); else { ctx.moveTo(axisX(i), y(f)); started = true; }
        });
        ctx.stroke();
      });
      ctx.font = "11px system-ui, sans-serif";
      axes.forEach(function (axis, i) {
        var x = axisX(i);
        ctx.strokeStyle = "#667085"; ctx.lineWidth = 1;
        ctx.beginPath(); ctx.moveTo(x, y(1)); ctx.lineTo(x, y(0)); ctx.stroke();
        ctx.fillStyle = "#1d2433"; ctx.textAlign = "center";
        ctx.fillText(axis.name.length > 18 ? axis.name.slice(0, 17) + "…" : axis.name, x, 14);
        ctx.fillStyle = "#667085";
        ctx.textAlign = i === axes.length - 1 ? "right" : "left";
        var dx = i === axes.length - 1 ? -4 : 4;
        if (axis.numeric) { ctx.fillText(label(axis, 1), x + dx, y(1) + 10); ctx.fillText(label(axis, 0), x + dx, y(0) - 2); }
        else axis.categories.forEach(function (c) { ctx.fillText(c, x + dx, y(fraction(axis, c)) + 4); });
        if (axis.brush) {
          ctx.fillStyle = "rgba(53, 86, 212, 0.18)";
          ctx.fillRect(x - 7, y(axis.brush[1]), 14, y(axis.brush[0]) - y(axis.brush[1]));
        }
      });
      canvas.setAttribute("data-brushed", String(keep));
      document.querySelectorAll((canvas.getAttribute("data-table") || "#compare-units") + " tbody tr[data-wid]").forEach(function (row) {
        var unit = data.units.find(function (u) { return String(u.wid) === row.getAttribute("data-wid"); });
        row.hidden = unit ? !kept(unit) : false;
      });
    }
    function nearestAxis(px) {
      var best = -1, gap = 40;
      axes.forEach(function (_, i) { var d = Math.abs(axisX(i) - px); if (d < gap) { gap = d; best = i; } });
      return best;
    }
    function at(event) {
      var box = canvas.getBoundingClientRect();
      return { x: event.clientX - box.left, f: Math.min(1, Math.max(0, 1 - (event.clientY - box.top - PAD_TOP) / (HEIGHT - PAD_TOP - PAD_BOTTOM))) };
    }
    canvas.addEventListener("pointerdown", function (event) {
      var p = at(event), i = nearestAxis(p.x);
      if (i < 0) return;
      state.drag = { axis: i, from: p.f, moved: false };
      canvas.setPointerCapture(event.pointerId);
    });
    canvas.addEventListener("pointermove", function (event) {
      if (!state.drag) return;
      var p = at(event);
      if (Math.abs(p.f - state.drag.from) > 0.01) state.drag.moved = true;
      if (state.drag.moved) { axes[state.drag.axis].brush = [Math.min(p.f, state.drag.from), Math.max(p.f, state.drag.from)]; draw(); }
    });
    canvas.addEventListener("pointerup", function () {
      if (state.drag && !state.drag.moved) axes[state.drag.axis].brush = null;
      state.drag = null;
      draw();
    });
    size(); draw();
    window.addEventListener("resize", function onResize() {
      if (!canvas.isConnected) { window.removeEventListener("resize", onResize); return; }
      size(); draw();
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("canvas[data-parallel]").forEach(function (canvas) { if (!canvas.__parallel) setup(canvas); });
  });
  // A live page (the study page) swaps in a new canvas with new data.
  document.addEventListener("htmx:load", function (event) {
    if (!(event.target instanceof Element)) return;
    var found = event.target.matches("canvas[data-parallel]") ? [event.target] : event.target.querySelectorAll("canvas[data-parallel]");
    Array.prototype.forEach.call(found, function (canvas) { if (!canvas.__parallel) setup(canvas); });
  });
})();
