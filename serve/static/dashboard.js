// kvscope live dashboard: polls the serve's named-query API and redraws.
// Line charts use the vendored uPlot (MIT, static/uPlot.LICENSE); bar charts are plain SVG.
"use strict";

(function () {
  const POLL_MS = 2000;
  const INGEST_POINTS = 300;
  const COLORS = ["#2f6fdf", "#e07b00", "#1e7d4f", "#b3261e", "#7a4fd6", "#00838f", "#8d6e63",
    "#c2185b", "#546e7a", "#9e9d24"];
  const token = new URLSearchParams(location.search).get("token");
  const charts = {};
  const ingest = { t: [], rate: [], lag: [], last: null };
  let polling = false;

  const $ = (id) => document.getElementById(id);

  function withToken(path) {
    return token ? path + (path.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token) : path;
  }

  async function getJSON(path) {
    const reply = await fetch(withToken(path), { cache: "no-store" });
    const body = await reply.json();
    if (!reply.ok) throw new Error(body.error || reply.status + " " + reply.statusText);
    return body;
  }

  function windowSeconds() { return Number($("window").value); }

  function windowRange() {
    const now = Date.now() / 1000;
    return [now - windowSeconds(), now];
  }

  function bucketSeconds(span, minimum) {
    const steps = [5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400];
    for (const s of steps) if (s >= minimum && span / s <= 60) return s;
    return 86400;
  }

  function query(name, params) {
    const search = new URLSearchParams(params);
    return getJSON("api/query/" + name + "?" + search.toString()).then((a) => a.rows);
  }

  const epoch = (iso) => Date.parse(iso.endsWith("Z") || iso.includes("+") ? iso : iso + "Z") / 1000;
  const pct = (v) => (v === null || v === undefined ? "–" : (100 * v).toFixed(1) + " %");
  function num(v, digits) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    if (Math.abs(v) >= 1e6) return (v / 1e6).toFixed(2) + " M";
    if (Math.abs(v) >= 1e4) return (v / 1e3).toFixed(1) + " k";
    return v.toFixed(digits === undefined ? 1 : digits);
  }

  function markRendered(el, points) {
    el.dataset.rendered = "1";
    el.dataset.points = String(points);
  }

  function empty(el, text) {
    if (charts[el.id]) { charts[el.id].destroy(); delete charts[el.id]; }
    el.innerHTML = '<div class="empty">' + text + "</div>";
    markRendered(el, 0);
  }

  // A uPlot line chart; rebuilt when the series change, else updated in place.
  // `xRange` ([from, to] in seconds) pins the time axis to the picked window; without it
  // the axis follows the data.
  function lines(id, xs, series, yLabel, yFormat, right, xRange) {
    const el = $(id);
    if (!xs.length) { empty(el, "no data in this window yet"); return; }
    const key = series.map((s) => s.label).join("|");
    const data = [xs, ...series.map((s) => s.values)];
    const existing = charts[id];
    if (existing && existing._key === key) {
      existing._xRange = xRange;
      existing.setData(data);
    } else {
      if (existing) existing.destroy();
      el.innerHTML = "";
      const axes = [
        { label: "time (UTC)", stroke: "#5b6475", grid: { stroke: "#eef0f4" } },
        { label: yLabel, stroke: "#5b6475", grid: { stroke: "#eef0f4" }, size: 60,
          values: (u, vals) => vals.map((v) => yFormat(v)) },
      ];
      const holder = { range: xRange };
      const scales = { x: { time: true, range: (u, min, max) => holder.range || [min, max] } };
      if (right) {
        axes.push({ label: right.label, side: 1, scale: "right", stroke: "#5b6475", grid: { show: false },
          size: 60, values: (u, vals) => vals.map((v) => right.format(v)) });
        scales.right = { auto: true };
      }
      const opts = {
        width: Math.max(el.clientWidth, 300), height: 240, tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"),
        scales, axes,
        series: [{ label: "time" }, ...series.map((s, i) => ({
          label: s.label, stroke: s.color || COLORS[i % COLORS.length], width: 2,
          scale: s.scale || "y", value: (u, v) => (s.scale ? right.format(v) : yFormat(v)),
          spanGaps: true, points: { show: xs.length < 40 },
        }))],
      };
      charts[id] = new uPlot(opts, data, el);
      charts[id]._key = key;
      Object.defineProperty(charts[id], "_xRange", { set: (r) => { holder.range = r; } });
    }
    markRendered(el, xs.length);
  }

  // Horizontal SVG bars: rows of {label, values: [..]} against one shared scale.
  function bars(id, rows, names, unit, format, maximum) {
    const el = $(id);
    if (!rows.length) { empty(el, "no data in this window yet"); return; }
    if (charts[id]) { charts[id].destroy(); delete charts[id]; }
    const width = Math.max(el.clientWidth, 300);
    const labelW = 170, valueW = 70, barH = 12, gap = 6;
    const rowH = names.length * barH + gap * 2;
    const height = rows.length * rowH + 28;
    const top = maximum || Math.max(...rows.flatMap((r) => r.values.filter((v) => v !== null)), 1e-9);
    const plotW = width - labelW - valueW;
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("class", "bars");
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("role", "img");
    const add = (tag, attrs, text) => {
      const node = document.createElementNS(ns, tag);
      for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
      if (text !== undefined) node.textContent = text;
      svg.appendChild(node);
      return node;
    };
    rows.forEach((row, i) => {
      const y = i * rowH + gap;
      add("text", { x: labelW - 8, y: y + (names.length * barH) / 2 + 4, "text-anchor": "end" }, row.label);
      row.values.forEach((v, j) => {
        const w = v === null ? 0 : Math.max(1, (plotW * v) / top);
        add("rect", { x: labelW, y: y + j * barH, width: w, height: barH - 2, fill: COLORS[j % COLORS.length], rx: 2 })
          .appendChild(document.createElementNS(ns, "title")).textContent = names[j] + ": " + format(v) + " " + unit;
        add("text", { x: labelW + w + 4, y: y + j * barH + barH - 3 }, format(v));
      });
    });
    const axisY = rows.length * rowH + 4;
    add("line", { class: "axis", x1: labelW, x2: labelW + plotW, y1: axisY, y2: axisY });
    add("text", { x: labelW, y: axisY + 16 }, "0");
    add("text", { x: labelW + plotW, y: axisY + 16, "text-anchor": "end" }, format(top) + " " + unit);
    el.innerHTML = "";
    el.appendChild(svg);
    if (names.length > 1) {
      const legend = document.createElement("div");
      legend.className = "legend";
      names.forEach((n, j) => {
        const item = document.createElement("span");
        const swatch = document.createElement("i");
        swatch.style.background = COLORS[j % COLORS.length];
        item.appendChild(swatch);
        item.appendChild(document.createTextNode(n));
        legend.appendChild(item);
      });
      el.appendChild(legend);
    }
    markRendered(el, rows.length);
  }

  function drawHitRate(rows) {
    // Each prompt once: a decode instance looks the prompt up again (P/D), so the fleet
    // figure sums the instances that prefill, as the report does.
    const served = rows.filter((r) => r.instance !== "*" && r.role !== "decode");
    const queried = served.reduce((n, r) => n + r.prefix_queries, 0);
    const hits = served.reduce((n, r) => n + r.prefix_hits, 0);
    $("kpi-hit-rate").textContent = pct(queried ? hits / queried : null);
    const shown = rows.filter((r) => r.prefix_queries > 0).map((r) => ({
      label: r.instance === "*" ? "fleet" : r.instance + (r.dp_rank ? " dp" + r.dp_rank : ""),
      values: [r.hit_rate === null ? null : 100 * r.hit_rate],
    }));
    bars("chart-hit-rate", shown, ["hit rate"], "%", (v) => (v === null ? "–" : v.toFixed(1)), 100);
  }

  function drawChurn(rows, bucket) {
    const byTime = new Map();
    for (const r of rows) {
      const t = epoch(r.bucket);
      const cur = byTime.get(t) || { stores: 0, removals: 0 };
      cur.stores += r.stores;
      cur.removals += r.removals;
      byTime.set(t, cur);
    }
    const xs = [...byTime.keys()].sort((a, b) => a - b);
    const stores = xs.map((t) => byTime.get(t).stores / bucket);
    const evictions = xs.map((t) => byTime.get(t).removals / bucket);
    const last = xs.length > 1 ? xs.length - 2 : xs.length - 1;  // the newest bucket is still filling
    $("kpi-stores").textContent = last >= 0 ? num(stores[last]) + " /s" : "–";
    $("kpi-evictions").textContent = last >= 0 ? num(evictions[last]) + " /s" : "–";
    lines("chart-churn", xs, [
      { label: "stores/s", values: stores },
      { label: "evictions/s", values: evictions },
    ], "blocks/s", (v) => num(v), null, windowRange());
  }

  function drawUsage(rows) {
    const instances = [...new Set(rows.map((r) => r.instance))].sort();
    const xs = [...new Set(rows.map((r) => epoch(r.t)))].sort((a, b) => a - b);
    const index = new Map(xs.map((t, i) => [t, i]));
    const series = instances.map((name) => {
      const values = xs.map(() => null);
      for (const r of rows) if (r.instance === name) values[index.get(epoch(r.t))] = 100 * r.usage;
      return { label: name, values };
    });
    lines("chart-usage", xs, series, "% in use", (v) => (v === null ? "–" : v.toFixed(1) + "%"),
      null, windowRange());
  }

  function drawTransfers(rows) {
    const pairs = rows.map((r) => ({
      label: r.src_instance + " → " + r.dst_instance, values: [r.p50_ms, r.p99_ms],
    }));
    bars("chart-transfers", pairs, ["p50", "p99"], "ms", (v) => (v === null ? "–" : num(v, 1)));
  }

  function drawCompleteness(rows) {
    const el = $("chart-completeness");
    if (!rows.length) { empty(el, "no data in this window yet"); $("kpi-completeness").textContent = "–"; $("kpi-gaps").textContent = "–"; return; }
    const lowest = Math.min(...rows.map((r) => (r.completeness === null ? 1 : r.completeness)));
    const lost = rows.reduce((s, r) => s + (r.declared_lost || 0) + Math.max(r.undeclared_missing || 0, 0), 0);
    $("kpi-completeness").textContent = pct(lowest);
    $("kpi-gaps").textContent = num(lost, 0);
    const table = document.createElement("table");
    const head = table.createTHead().insertRow();
    for (const h of ["source", "stream", "expected", "stored", "declared lost", "undeclared", "completeness"]) {
      const th = document.createElement("th");
      th.textContent = h;
      head.appendChild(th);
    }
    // Epochs are 64-bit (not exact in JavaScript): number each source's runs 1, 2, ...
    const runs = new Map();
    for (const r of rows) {
      const source = r.instance + "/" + r.dp_rank;
      if (!runs.has(source)) runs.set(source, []);
      if (!runs.get(source).includes(r.epoch)) runs.get(source).push(r.epoch);
    }
    const body = table.createTBody();
    for (const r of rows) {
      const tr = body.insertRow();
      const sourceRuns = runs.get(r.instance + "/" + r.dp_rank);
      const run = sourceRuns.length > 1 ? " (run " + (sourceRuns.indexOf(r.epoch) + 1) + ")" : "";
      const cells = [r.instance + (r.dp_rank ? " dp" + r.dp_rank : "") + run, r.stream, r.expected,
        r.present, r.declared_lost, r.undeclared_missing, pct(r.completeness)];
      cells.forEach((c, i) => {
        const td = tr.insertCell();
        td.textContent = c === null || c === undefined ? "–" : String(c);
        if (i === 6) td.className = r.completeness < 1 ? "bad" : "good";
        if ((i === 4 || i === 5) && c > 0) td.className = "bad";
      });
    }
    el.innerHTML = "";
    el.appendChild(table);
    markRendered(el, rows.length);
  }

  function drawIngest(status) {
    if (ingest.last) {
      const dt = status.time - ingest.last.time;
      if (dt > 0) {
        ingest.t.push(status.time);
        ingest.rate.push(Math.max(0, status.rows_inserted - ingest.last.rows_inserted) / dt);
        ingest.lag.push(status.lag_records);
        for (const key of ["t", "rate", "lag"]) ingest[key] = ingest[key].slice(-INGEST_POINTS);
      }
    }
    ingest.last = status;
    const rate = ingest.rate.length ? ingest.rate[ingest.rate.length - 1] : null;
    $("kpi-ingest").textContent = rate === null ? "–" : num(rate) + " /s";
    $("kpi-lag").textContent = num(status.lag_records, 0);
    lines("chart-ingest", ingest.t, [
      { label: "rows/s stored", values: ingest.rate },
      { label: "lag (records)", values: ingest.lag, scale: "right" },
    ], "rows/s", (v) => num(v), { label: "records", format: (v) => num(v, 0) });
  }

  async function refresh() {
    if (polling) return;
    polling = true;
    const span = windowSeconds();
    const since = new Date(Date.now() - span * 1000).toISOString();
    const minuteBucket = bucketSeconds(span, 60);
    const usageBucket = bucketSeconds(span, 5);
    try {
      const [hit, churn, usage, transfers, completeness, status] = await Promise.all([
        query("hit_rate", { since }),
        query("eviction_churn_timeline", { since, bucket_s: minuteBucket }),
        query("report_usage", { since, bucket_s: usageBucket }),
        query("transfer_latency", { since, bucket_s: 4000000000 }),
        query("completeness", { since }),
        getJSON("api/collector"),
      ]);
      drawHitRate(hit);
      drawChurn(churn, minuteBucket);
      drawUsage(usage);
      drawTransfers(transfers);
      drawCompleteness(completeness);
      drawIngest(status);
      $("error").hidden = true;
      $("status").className = "status";
      $("status").textContent = "updated " + new Date().toISOString().slice(11, 19) + " UTC, every " + POLL_MS / 1000 + " s";
      document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
    } catch (err) {
      $("error").hidden = false;
      $("error").textContent = "Cannot update: " + err.message;
      $("status").className = "status stale";
    } finally {
      polling = false;
    }
  }

  function updateLinks() {
    const since = Math.round(Date.now() / 1000 - windowSeconds());
    $("report-link").href = withToken("report?since=" + since);
    $("queries-link").href = withToken("api/queries");
  }

  $("window").addEventListener("change", () => {
    updateLinks();
    refresh();
  });
  window.addEventListener("resize", () => {
    for (const [id, chart] of Object.entries(charts)) chart.setSize({ width: Math.max($(id).clientWidth, 300), height: 240 });
  });
  updateLinks();
  refresh();
  setInterval(() => { updateLinks(); refresh(); }, POLL_MS);
})();
