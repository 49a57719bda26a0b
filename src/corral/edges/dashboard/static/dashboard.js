// corral dashboard: live updates over server-sent events, charts, the pause button.
// Every value is written with textContent or as an SVG attribute, never as HTML.
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
  var source = null;
  var paused = false;
  var updates = 0;

  function setLive(shown) {
    document.querySelectorAll("[data-live]").forEach(function (el) {
      var key = el.getAttribute("data-live");
      if (Object.prototype.hasOwnProperty.call(shown, key)) el.textContent = String(shown[key]);
    });
  }

  function drawChart(svg, values, maxHint) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    var w = 300, h = 80, pad = 4;
    var nums = values.filter(function (v) { return v !== null && v !== undefined; });
    var max = Math.max(maxHint || 0, nums.length ? Math.max.apply(null, nums) : 0) || 1;
    var step = values.length > 1 ? w / (values.length - 1) : w;
    var d = "", pen = false, last = null;
    values.forEach(function (v, i) {
      if (v === null || v === undefined) { pen = false; return; }
      var x = (i * step).toFixed(1), y = (h - pad - (v / max) * (h - 2 * pad)).toFixed(1);
      d += (pen ? " L" : " M") + x + " " + y;
      pen = true;
      last = [x, y];
    });
    var base = document.createElementNS(SVG, "line");
    base.setAttribute("x1", "0"); base.setAttribute("x2", String(w));
    base.setAttribute("y1", String(h - pad)); base.setAttribute("y2", String(h - pad));
    base.setAttribute("class", "axis");
    svg.appendChild(base);
    if (d) {
      var path = document.createElementNS(SVG, "path");
      path.setAttribute("d", d.trim());
      path.setAttribute("class", "line");
      svg.appendChild(path);
    }
    if (last) {
      var dot = document.createElementNS(SVG, "circle");
      dot.setAttribute("cx", last[0]); dot.setAttribute("cy", last[1]); dot.setAttribute("r", "2.5");
      dot.setAttribute("class", "dot");
      svg.appendChild(dot);
    }
    var label = document.createElementNS(SVG, "text");
    label.setAttribute("x", "2"); label.setAttribute("y", "10"); label.setAttribute("class", "max");
    label.textContent = "max " + (max < 10 ? max.toPrecision(2) : Math.round(max));
    svg.appendChild(label);
  }

  function drawCharts(points) {
    document.querySelectorAll("svg[data-chart]").forEach(function (svg) {
      var key = svg.getAttribute("data-chart");
      var values = points.map(function (p) { return p[key]; });
      drawChart(svg, values, key === "success_rate" ? 1 : 0);
    });
  }

  function setAlerts(alerts) {
    var ul = document.getElementById("alerts");
    if (!ul) return;
    while (ul.firstChild) ul.removeChild(ul.firstChild);
    alerts.forEach(function (a) {
      var li = document.createElement("li");
      li.className = a.firing ? "firing" : "ok";
      var b = document.createElement("b");
      b.textContent = a.name;
      var span = document.createElement("span");
      span.textContent = a.summary;
      li.appendChild(b); li.appendChild(document.createTextNode(" ")); li.appendChild(span);
      ul.appendChild(li);
    });
  }

  function addEvent(ev) {
    var ul = document.getElementById("events");
    if (!ul) return;
    var empty = ul.querySelector(".empty");
    if (empty) ul.removeChild(empty);
    var li = document.createElement("li");
    var t = document.createElement("time"); t.textContent = ev.at;
    var b = document.createElement("b"); b.textContent = ev.kind;
    var code = document.createElement("code"); code.textContent = String(ev.data).slice(0, 200);
    li.appendChild(t); li.appendChild(document.createTextNode(" "));
    li.appendChild(b); li.appendChild(document.createTextNode(" " + ev.subject + " "));
    li.appendChild(code);
    ul.insertBefore(li, ul.firstChild);
    while (ul.children.length > 50) ul.removeChild(ul.lastChild);
  }

  function setTask(t) {
    document.querySelectorAll("[data-task]").forEach(function (el) {
      var key = el.getAttribute("data-task");
      if (key === "progress_bar") { el.value = t.progress_value || 0; return; }
      if (Object.prototype.hasOwnProperty.call(t, key)) el.textContent = String(t[key]);
      if (key === "status") el.className = "st st-" + String(t.status).toLowerCase();
    });
  }

  function setRow(r) {
    var tr = document.querySelector('tr[data-row="' + String(Number(r.id)) + '"]');
    if (!tr) return;
    var st = tr.querySelector('[data-col="status"]');
    var at = tr.querySelector('[data-col="attempt"]');
    if (st && st.textContent.trim() === String(r.status) && (!at || at.textContent === String(r.attempt))) return;
    if (st) {
      var span = document.createElement("span");
      span.className = "st st-" + String(r.status).toLowerCase();
      span.textContent = String(r.status);
      while (st.firstChild) st.removeChild(st.firstChild);
      st.appendChild(span);
    }
    var since = tr.querySelector('[data-col="since"]');
    if (since) since.textContent = "changed just now";
    if (at) at.textContent = String(r.attempt);
    var err = tr.querySelector('[data-col="error"]');
    if (err) err.textContent = String(r.error);
    tr.setAttribute("data-changed", "1");
  }

  function bump() {
    updates += 1;
    document.body.setAttribute("data-updates", String(updates));
  }

  function open() {
    var url = document.body.getAttribute("data-stream");
    if (!url || !window.EventSource) return;
    source = new EventSource(url);
    source.addEventListener("snapshot", function (e) {
      var snap = JSON.parse(e.data);
      setLive(snap.shown);
      drawCharts(snap.points);
      setAlerts(snap.alerts);
      bump();
    });
    source.addEventListener("event", function (e) { addEvent(JSON.parse(e.data)); });
    source.addEventListener("task", function (e) { setTask(JSON.parse(e.data)); });
    source.addEventListener("row", function (e) { setRow(JSON.parse(e.data)); });
  }

  function close() {
    if (source) { source.close(); source = null; }
  }

  document.addEventListener("DOMContentLoaded", function () {
    var button = document.getElementById("pause");
    var state = document.getElementById("live-state");
    if (button) {
      button.addEventListener("click", function () {
        paused = !paused;
        if (paused) { close(); button.textContent = "Resume"; state.textContent = "paused"; }
        else { open(); button.textContent = "Pause"; state.textContent = "live"; }
        document.body.setAttribute("data-paused", paused ? "1" : "0");
      });
    }
    if (document.querySelector("svg[data-chart]")) {
      fetch("/api/snapshot", { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (snap) { if (snap) drawCharts(snap.points); });
    }
    open();
  });
  window.addEventListener("beforeunload", close);
})();
