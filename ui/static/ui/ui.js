// The pages' own script (a static file: the Content-Security-Policy allows no inline script).
// Row selection for bulk actions, a live indicator, full reload on the stream's "reload", and the
// logs panel's toggles. Everything else is htmx attributes in the templates.
(function () {
  "use strict";
  var selected = new Set();

  function syncSelection(root) {
    root.querySelectorAll("input[name=wid][type=checkbox]").forEach(function (box) {
      box.checked = selected.has(box.value);
    });
    var count = selected.size;
    document.querySelectorAll("[data-selected-count]").forEach(function (el) { el.textContent = String(count); });
    document.querySelectorAll("button[data-needs-selection]").forEach(function (b) { b.disabled = count === 0; });
  }

  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!(box instanceof HTMLInputElement)) return;
    if (box.name === "wid") {
      if (box.checked) selected.add(box.value); else selected.delete(box.value);
      syncSelection(document);
    } else if (box.hasAttribute("data-select-all")) {
      document.querySelectorAll("input[name=wid][type=checkbox]").forEach(function (b) {
        if (b.closest("tr") && b.closest("tr").hidden) return;
        if (box.checked) selected.add(b.value); else selected.delete(b.value);
      });
      syncSelection(document);
    }
  });

  // A row refreshed by an event keeps its check mark.
  document.addEventListener("htmx:afterSwap", function (event) { syncSelection(document); });
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("input[name=wid]:checked").forEach(function (b) { selected.add(b.value); });
    syncSelection(document);
  });

  // Live indicator and the "reload" event (the page missed changes it cannot replay). A refreshed
  // fragment that carries the indicator gets the stream's current state again.
  var liveState = "";
  function showLive() {
    if (!liveState) return;
    document.querySelectorAll("[data-live]").forEach(function (el) {
      el.classList.toggle("on", liveState === "live");
      el.textContent = liveState;
    });
  }
  document.addEventListener("htmx:afterSwap", showLive);
  document.addEventListener("htmx:sseOpen", function (event) {
    liveState = "live";
    showLive();
    var source = event.detail && event.detail.source;
    if (source && !source.__xmcReload) {
      source.__xmcReload = true;
      source.addEventListener("reload", function () { window.location.reload(); });
    }
  });
  document.addEventListener("htmx:sseError", function () {
    liveState = "reconnecting";
    showLive();
  });

  // Client-side sort of the work unit table by any column (numbers as numbers).
  document.addEventListener("click", function (event) {
    var th = event.target instanceof Element ? event.target.closest("th[data-sort]") : null;
    if (!th) return;
    var table = th.closest("table"), body = table.tBodies[0];
    var index = Array.prototype.indexOf.call(th.parentNode.children, th);
    var dir = th.getAttribute("data-dir") === "asc" ? "desc" : "asc";
    table.querySelectorAll("th[data-sort]").forEach(function (h) { h.removeAttribute("data-dir"); });
    th.setAttribute("data-dir", dir);
    var rows = Array.prototype.slice.call(body.rows);
    function key(row) {
      var cell = row.children[index];
      var text = cell ? (cell.getAttribute("data-value") || cell.textContent.trim()) : "";
      var n = Number(text);
      return text !== "" && !isNaN(n) ? [0, n] : [1, text.toLowerCase()];
    }
    rows.sort(function (a, b) {
      var ka = key(a), kb = key(b);
      var c = ka[0] - kb[0] || (ka[1] < kb[1] ? -1 : ka[1] > kb[1] ? 1 : 0);
      return dir === "asc" ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });

  // Quick filter of the work unit table by text in any cell (the server-side filter takes AIP-160).
  document.addEventListener("input", function (event) {
    var input = event.target;
    if (!(input instanceof HTMLInputElement) || !input.hasAttribute("data-quick-filter")) return;
    var needle = input.value.trim().toLowerCase();
    document.querySelectorAll(input.getAttribute("data-quick-filter") + " tbody tr").forEach(function (row) {
      row.hidden = needle !== "" && row.textContent.toLowerCase().indexOf(needle) === -1;
    });
  });

  // Logs panel: keep a followed log scrolled to the end as lines arrive (ui/logfollow.py pushes
  // them), drop the "no lines yet" placeholder at the first, and say when the stream ended.
  // A live log (data-end: a running pod's, not "Show older lines") opens at its newest line too.
  function followedLog() { return document.querySelector(".logtext[data-follow]"); }
  document.addEventListener("htmx:afterSettle", function () {
    var pre = document.querySelector(".logtext[data-follow], .logtext[data-end]");
    if (pre) pre.scrollTop = pre.scrollHeight;
  });
  document.addEventListener("htmx:sseMessage", function (event) {
    var pre = followedLog();
    if (!pre || event.target !== pre) return;
    var empty = pre.querySelector(":scope > .muted");
    if (empty) empty.remove();
    pre.setAttribute("data-lines", String(pre.children.length));
    pre.scrollTop = pre.scrollHeight;
  });
  document.addEventListener("htmx:sseClose", function (event) {
    var pre = followedLog();
    if (!pre || event.target !== pre || !event.detail || event.detail.type !== "message") return;
    pre.setAttribute("data-follow-ended", "");  // the stream's "end": the container stopped
    var note = document.getElementById("log-follow-state");
    if (note) note.textContent = "The container stopped: nothing more to follow.";
  });
})();
