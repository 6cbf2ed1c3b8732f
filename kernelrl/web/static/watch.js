// The run page's only script: poll the page's JSON endpoint and refresh its tables, texts and
// charts. Text goes into the page through textContent only (never innerHTML), and a link is
// followed only when the server built it as a path on this site ("/..." or "#...").
(function () {
  "use strict";
  var body = document.body;
  var api = body.dataset.api;
  var kind = body.dataset.page;
  if (!api) {
    return;
  }
  var COLORS = ["#264653", "#e76f51", "#2a9d8f", "#e9c46a", "#8d5a97", "#f4a261", "#457b9d", "#6a994e",
                "#bc4749", "#3d405b", "#9c6644", "#118ab2"];
  var charts = {};
  var updates = 0;

  function safeHref(href) {
    return typeof href === "string" && /^[\/#]/.test(href) && !/^\/\//.test(href);
  }

  function fillCell(td, cell) {
    if (typeof cell === "string") {
      td.textContent = cell;
      return;
    }
    if (cell.cls) {
      td.className = cell.cls;
    }
    if (cell.href && safeHref(cell.href)) {
      var a = document.createElement("a");
      a.setAttribute("href", cell.href);
      a.textContent = cell.text;
      td.appendChild(a);
    } else {
      td.textContent = cell.text;
    }
  }

  var shown = {};  // table id -> the rows last written, so an unchanged table is left alone

  function fillTable(id, table) {
    var t = document.getElementById(id);
    if (!t || !table) {
      return;
    }
    var signature = JSON.stringify(table.rows);
    if (shown[id] === signature) {
      return;  // rebuilding it would replace the links under the reader's pointer for nothing
    }
    shown[id] = signature;
    var rows = document.createDocumentFragment();
    table.rows.forEach(function (row) {
      var tr = document.createElement("tr");
      row.forEach(function (cell, i) {
        var td = document.createElement("td");
        fillCell(td, cell);
        td.dataset.label = table.header[i] || "";  // a phone stacks the row into labelled lines
        tr.appendChild(td);
      });
      rows.appendChild(tr);
    });
    t.tBodies[0].replaceChildren(rows);
    t.hidden = table.rows.length === 0;
    var empty = document.getElementById(id + "-empty");
    if (empty) {
      empty.hidden = table.rows.length > 0;
    }
  }

  function setText(id, text) {
    var el = document.getElementById(id);
    if (el && el.textContent !== text) {
      el.textContent = text;
    }
  }

  function speedupTicks(u, values) {
    return values.map(function (v) { return v == null ? "" : (+v.toPrecision(3)) + "x"; });
  }

  function drawChart(id, spec) {
    var el = document.getElementById("chart-" + id);
    if (!el) {
      return;
    }
    if (!spec || !spec.x.length || !spec.series.length || typeof uPlot === "undefined") {
      if (charts[id]) {
        charts[id].plot.destroy();
        delete charts[id];
      }
      el.hidden = false;  // a placeholder, not a gap: say what will be drawn here
      el.className = "chart empty";
      el.textContent = (spec && spec.title ? spec.title + ": " : "") + "nothing to plot yet";
      return;
    }
    el.hidden = false;
    if (!charts[id]) {
      el.className = "chart";
      el.textContent = "";
    }
    var data = [spec.x].concat(spec.series.map(function (s) { return s.values; }));
    var key = spec.series.map(function (s) { return s.label; }).join("\u0000");
    var have = charts[id];
    if (have && have.key === key) {
      have.plot.setData(data);
      return;
    }
    if (have) {
      have.plot.destroy();
    }
    var series = [{}].concat(spec.series.map(function (s, i) {
      var line = {label: s.label, stroke: COLORS[i % COLORS.length], width: s.dash ? 1.6 : 2.4};
      if (s.dash) {
        line.dash = [6, 4];  // drawn over a solid line it leaves that line visible where they meet
      }
      if (spec.time) {
        line.paths = uPlot.paths.stepped({align: 1});  // a best-so-far holds until the next improvement
      }
      return line;
    }));
    var opts = {
      title: spec.title,
      width: Math.max(320, el.clientWidth || 800),
      height: 280,
      scales: {x: {time: !!spec.time}, y: spec.log ? {distr: 3} : {}},
      series: series,
      axes: [
        // time: labels spaced so they never run into each other; steps: whole steps only
        spec.time ? {label: spec.xlabel, space: 110} :
          {label: spec.xlabel, space: 50, incrs: [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000],
           values: function (u, vals) { return vals.map(function (v) { return String(Math.round(v)); }); }},
        spec.log ? {label: spec.ylabel, values: speedupTicks, size: 60} : {label: spec.ylabel, size: 60}
      ]
    };
    charts[id] = {key: key, plot: new uPlot(opts, data, el)};
  }

  function renderRun(d) {
    Object.keys(d.texts).forEach(function (k) { setText(k, d.texts[k]); });
    var bar = document.getElementById("bar");
    if (bar) {
      bar.max = Math.max(d.progress.max, 1);
      bar.value = d.progress.value;
    }
    d.cards.forEach(function (c, i) {
      var el = document.querySelector("[data-card='" + i + "']");
      if (el) {
        el.textContent = c.value;
      }
    });
    Object.keys(d.tables).forEach(function (k) { fillTable(k, d.tables[k]); });
    Object.keys(d.charts).forEach(function (k) { drawChart(k, d.charts[k]); });
  }

  function renderIndex(d) {
    fillTable("runs", d.tables.runs);
    var waiting = document.getElementById("waiting");
    if (waiting && d.tables.runs.rows.length) {
      waiting.hidden = true;
    }
  }

  // A task or candidate page is rendered by the server; it reloads when its task's candidate or
  // evaluated count in the run's JSON differs from what it shows ("seen"), while the run goes.
  function checkTask(j) {
    var line = (j.view.tasks || []).filter(function (t) { return t.task === body.dataset.task; })[0];
    var now = line ? line.candidates + "/" + line.evaluated : "";
    if (kind === "candidate" && !body.dataset.seen) {
      body.dataset.seen = now;  // the first answer is what the page was rendered with
    } else if (now !== body.dataset.seen) {
      window.location.reload();
    }
    return j.view.run.status === "running";
  }

  // The page's server is gone: say so plainly, once, and how to keep watching (the database holds
  // everything the run wrote). Polling goes on, so a server started again is picked up.
  function gone() {
    if (document.getElementById("gone")) {
      return;
    }
    var note = document.createElement("p");
    note.id = "gone";
    note.className = "note";
    var db = body.dataset.db ? " " + body.dataset.db : " <the run's database>";
    note.textContent = "This page's server has stopped: the run ended, or was stopped, and its page with it. " +
      "What you see is the last state it sent. Everything the run wrote is in its database; to keep " +
      "watching, run: kernelrl watch --db" + db;
    var main = document.querySelector("main");
    main.insertBefore(note, main.firstChild);
  }

  function poll() {
    var next = 2000;
    fetch(api, {headers: {"Accept": "application/json"}, credentials: "same-origin", cache: "no-store"})
      .then(function (r) {
        if (!r.ok) {
          throw new Error("HTTP " + r.status);
        }
        return r.json();
      })
      .then(function (j) {
        var note = document.getElementById("gone");
        if (note) {
          note.remove();  // a server answers again
        }
        if (kind === "run") {
          renderRun(j.display);
          next = j.display.running ? 2000 : 10000;
        } else if (kind === "task" || kind === "candidate") {
          next = checkTask(j) ? 3000 : 60000;
        } else {
          renderIndex(j.display);
        }
        updates += 1;
        body.dataset.updates = String(updates);
      })
      .catch(function (e) {
        setText("updated", "no answer from the server (" + e.message + "); retrying");
        if (updates > 0) {
          gone();  // it answered before: the page's server has stopped (with its run, most often)
        }
        next = 5000;
      })
      .finally(function () { window.setTimeout(poll, next); });
  }

  poll();
})();
