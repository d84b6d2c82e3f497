// The pages' own script (a static file: the Content-Security-Policy allows no inline script).
// Row selection for bulk actions, a live indicator, full reload on the stream's "reload", the
// stream's end on "denied" (access lost), the table's scroll hint, and the logs panel's toggles. Everything else is htmx attributes in the templates.
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

  // "Compare selected": the compare view of the selected work units (a plain GET, no form token in it).
  document.addEventListener("click", function (event) {
    var button = event.target instanceof Element ? event.target.closest("[data-compare]") : null;
    if (!button || !selected.size) return;
    var query = Array.from(selected).sort(function (a, b) { return a - b; })
      .map(function (w) { return "wid=" + encodeURIComponent(w); }).join("&");
    window.location.assign(button.getAttribute("data-compare") + "?" + query);
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
      var target = event.target;
      source.addEventListener("denied", function () { denied(source, target); });
    }
  });

  // "denied", a stream's last event (ui/events.py, ui/logfollow.py): the reader lost access to the
  // experiment (the share was taken back, the account deactivated, the token revoked). The stream is
  // closed here (the browser would reconnect and get 404 again and again), and the page says why.
  var DENIED_TEXT = "You no longer have access to this experiment (its owner took the share back, " +
    "or your account was deactivated): live updates stopped. Reload to check.";
  function denied(source, target) {
    source.close();
    var pre = followedLog();
    if (pre && target === pre) {
      pre.setAttribute("data-follow-ended", "");
      pre.setAttribute("data-denied", "");
      var note = document.getElementById("log-follow-state");
      if (note) note.textContent = "No longer followed: you no longer have access to this experiment.";
      return;
    }
    liveState = "access ended";
    showLive();
    if (document.getElementById("stream-denied")) return;
    var banner = document.createElement("p");
    banner.id = "stream-denied";
    banner.className = "error";
    banner.setAttribute("role", "alert");
    banner.textContent = DENIED_TEXT;
    var main = document.querySelector("main");
    if (main) main.insertBefore(banner, main.firstChild);
  }
  document.addEventListener("htmx:sseError", function () {
    liveState = "reconnecting";
    showLive();
  });

  // The table is sorted, filtered and paged by the server (links and forms); a select with
  // data-autosubmit (rows per page) sends its form when changed.
  document.addEventListener("change", function (event) {
    var select = event.target;
    if (select instanceof HTMLSelectElement && select.hasAttribute("data-autosubmit") && select.form) select.form.submit();
  });

  // A table that is wider than its box says so (the hint and a shadow at the edge it scrolls to).
  function markScrolling() {
    document.querySelectorAll("[data-scroll]").forEach(function (box) {
      var more = box.scrollWidth > box.clientWidth + 1;
      box.classList.toggle("scrolls", more);
      box.classList.toggle("at-end", box.scrollLeft + box.clientWidth >= box.scrollWidth - 1);
      var hint = box.previousElementSibling;
      if (hint && hint.classList.contains("scroll-hint")) hint.hidden = !more;
    });
  }
  document.addEventListener("DOMContentLoaded", markScrolling);
  window.addEventListener("resize", markScrolling);
  document.addEventListener("htmx:afterSettle", markScrolling);
  document.addEventListener("scroll", function (event) {
    var box = event.target;
    if (box instanceof Element && box.hasAttribute("data-scroll")) {
      box.classList.toggle("at-end", box.scrollLeft + box.clientWidth >= box.scrollWidth - 1);
    }
  }, true);

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
