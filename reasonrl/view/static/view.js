// reasonrl view: the page's script. Plain browser JavaScript, no library, nothing loaded from the network.
// Served: data from the JSON API (/api/...), metrics polled for new steps. Exported: window.VIEW_DATA holds the
// data and the same queries are answered here. Filter state lives in the URL query (?run=0&verdict=failed&x=step).
(function () {
  "use strict";
  const INLINE = window.VIEW_DATA || null;
  const query = new URLSearchParams(location.search);
  const pathRun = (location.pathname.match(/^\/run\/(\d+)/) || [])[1];
  const state = {
    run: +(query.get("run") || pathRun || 0),
    x: query.get("x") === "samples" ? "samples" : "step",
    smooth: Math.max(1, +(query.get("smooth") || 1)),
    hidden: new Set((query.get("hide") || "").split(",").filter(Boolean)),
    info: null, metrics: [], charts: [],
  };
  const FILTERS = ["step", "step_min", "step_max", "data_source", "verifier", "verdict", "reason", "reward_min",
    "reward_max", "len_min", "len_max"];
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#7f7f7f", "#bcbd22"];
  const DASHES = ["", "6 3", "2 2", "8 3 2 3"];
  const el = window.reasonrlView.el;  // static/dom.js

  function setQuery(changes) {
    for (const [k, v] of Object.entries(changes)) {
      if (v === "" || v === null || v === undefined) query.delete(k); else query.set(k, v);
    }
    history.replaceState(null, "", location.pathname + (query.toString() ? "?" + query : "") + location.hash);
  }

  // ------------------------------------------------------------------ data: the API, or the exported copy
  async function api(path, params) {
    if (INLINE) return inlineApi(path, params || {});
    const response = await fetch(path + "?" + new URLSearchParams(params || {}));
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    return body;
  }

  function inlineApi(path, params) {
    const run = +(params.run || 0);
    if (path === "/api/runs") return INLINE.info;
    if (path === "/api/metrics") return INLINE.metrics[run];
    if (path === "/api/health") return INLINE.health[run];
    if (path === "/api/samples") return inlineSamples(INLINE.samples[run], params);
    throw new Error("no " + path);
  }

  function verdictOf(row) {
    if (row.failed) return "failed";
    const correct = row.correct === null || row.correct === undefined ? row.reward > 0 : row.correct;
    return correct ? "correct" : "wrong";
  }

  function inlineSamples(log, params) {
    const num = (k) => (params[k] === undefined || params[k] === "" ? null : +params[k]);
    const lo = params.step ? +params.step : num("step_min"), hi = params.step ? +params.step : num("step_max");
    const rows = log.rows.filter((r) => {
      const len = Number.isInteger(r.response_tokens) ? r.response_tokens : (r.response || "").length;
      if ((lo !== null && r.step < lo) || (hi !== null && r.step > hi)) return false;
      if (num("reward_min") !== null && !(r.reward >= num("reward_min"))) return false;
      if (num("reward_max") !== null && !(r.reward <= num("reward_max"))) return false;
      if ((num("len_min") !== null && len < num("len_min")) || (num("len_max") !== null && len > num("len_max"))) {
        return false;
      }
      for (const f of ["data_source", "verifier"]) if (params[f] && String(r[f] ?? "") !== params[f]) return false;
      if (params.verdict && verdictOf(r) !== params.verdict) return false;
      if (params.reason && !String(r.reason || "").toLowerCase().includes(params.reason.toLowerCase())) return false;
      return true;
    });
    const offset = +(params.offset || 0), limit = +(params.limit || 20);
    return { total: rows.length, offset, limit, facets: log.facets, rows_in_log: log.rows.length,
      skipped_lines: log.skipped_lines, truncated_tail: log.truncated_tail,
      rows: rows.slice(offset, offset + limit).map((r) => Object.assign({ verdict: verdictOf(r) }, r)) };
  }

  // ------------------------------------------------------------------ curves
  function smooth(values, window) {
    if (window <= 1) return values;
    const out = [];
    let total = 0;
    values.forEach((v, i) => {
      total += v;
      if (i >= window) total -= values[i - window];
      out.push(total / Math.min(i + 1, window));
    });
    return out;
  }

  function niceTicks(lo, hi, count) {
    if (!(hi > lo)) return [lo];
    const raw = (hi - lo) / count, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
    const ticks = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(+t.toPrecision(12));
    return ticks;
  }

  function fmt(v) {
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(1);
    return String(+v.toPrecision(4));
  }

  function seriesOf(chart) {
    const patterns = chart.keys.map((k) => new RegExp("^(?:" + k + ")$"));
    const xKey = state.info.x_axes[state.x];
    const out = [];
    state.metrics.forEach((m, runIndex) => {
      if (state.hidden.has(String(runIndex))) return;
      const keys = new Set();
      m.records.forEach((r) => Object.keys(r).forEach((k) => { if (patterns.some((p) => p.test(k))) keys.add(k); }));
      [...keys].sort().forEach((key) => {
        const pts = m.records.filter((r) => typeof r[key] === "number" && typeof r[xKey] === "number")
          .map((r) => [r[xKey], r[key]]);
        if (pts.length) out.push({ run: runIndex, key, pts });
      });
    });
    return out;
  }

  function drawChart(chart) {
    const series = seriesOf(chart);
    if (!series.length) return null;
    const W = 620, H = 260, L = 56, R = 10, T = 10, B = 30;
    const xs = series.flatMap((s) => s.pts.map((p) => p[0])), ys = series.flatMap((s) => s.pts.map((p) => p[1]));
    let [x0, x1] = [Math.min(...xs), Math.max(...xs)], [y0, y1] = [Math.min(...ys), Math.max(...ys)];
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R), sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
    const svg = el("svg:svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, class: "chart" });
    for (const t of niceTicks(y0, y1, 5)) {
      svg.append(el("svg:line", { x1: L, x2: W - R, y1: sy(t), y2: sy(t), class: "grid" }),
        el("svg:text", { x: L - 4, y: sy(t) + 4, "text-anchor": "end" }, fmt(t)));
    }
    for (const t of niceTicks(x0, x1, 6)) {
      svg.append(el("svg:text", { x: sx(t), y: H - 10, "text-anchor": "middle" }, fmt(t)));
    }
    svg.append(el("svg:text", { x: W - R, y: H - 1, "text-anchor": "end", class: "axis" },
      state.x === "step" ? "step" : "responses trained on"));
    const keys = [...new Set(series.map((s) => s.key))];
    const legend = el("div", { class: "legend" });
    for (const s of series) {
      const color = COLORS[keys.indexOf(s.key) % COLORS.length], dash = DASHES[s.run % DASHES.length];
      const line = (values, cls) => el("svg:path", { class: cls, stroke: color, "stroke-dasharray": dash || null,
        "data-key": s.key, "data-run": s.run,
        d: s.pts.map((p, i) => (i ? "L" : "M") + sx(p[0]).toFixed(1) + " " + sy(values[i]).toFixed(1)).join(" ") });
      const raw = s.pts.map((p) => p[1]);
      if (state.smooth > 1) svg.append(line(raw, "raw"));
      svg.append(line(smooth(raw, state.smooth), "series"));
      if (s.pts.length === 1) svg.append(el("svg:circle", { cx: sx(s.pts[0][0]), cy: sy(raw[0]), r: 3, fill: color }));
      const last = raw[raw.length - 1];
      legend.append(el("span", { class: "item" }, el("i", { style: `border-color:${color};border-style:${dash ? "dashed" : "solid"}` }),
        (state.metrics.length > 1 ? state.info.runs[s.run].label + " · " : "") + s.key + " = " + fmt(last)));
    }
    return el("figure", { id: "chart-" + chart.id }, el("figcaption", {}, chart.title), svg, legend);
  }

  function drawCharts() {
    const box = document.getElementById("charts");
    box.replaceChildren(...state.info.charts.map(drawChart).filter(Boolean));
    if (!box.children.length) box.append(el("p", { class: "empty" }, "no metrics yet (metrics.jsonl has no step)"));
  }

  function curveControls() {
    const box = document.getElementById("curve-controls");
    const xSel = el("select", { id: "x-axis" }, Object.keys(state.info.x_axes).map((x) =>
      el("option", { value: x, selected: x === state.x }, x === "step" ? "x: step" : "x: responses trained on")));
    xSel.onchange = () => { state.x = xSel.value; setQuery({ x: state.x === "step" ? "" : state.x }); drawCharts(); };
    const sm = el("input", { id: "smooth", type: "number", min: 1, max: 200, value: state.smooth });
    sm.onchange = () => { state.smooth = Math.max(1, +sm.value || 1); setQuery({ smooth: state.smooth > 1 ? state.smooth : "" }); drawCharts(); };
    const runs = state.info.runs.map((r) => {
      const cb = el("input", { type: "checkbox", checked: !state.hidden.has(String(r.id)) });
      cb.onchange = () => {
        if (cb.checked) state.hidden.delete(String(r.id)); else state.hidden.add(String(r.id));
        setQuery({ hide: [...state.hidden].join(",") }); drawCharts();
      };
      return el("label", { class: "run" }, cb, el("span", { class: "dash" }, DASHES[r.id % DASHES.length] ? "- - " : "——"), r.label);
    });
    box.replaceChildren(xSel, el("label", {}, "smoothing (moving average, steps) ", sm), ...runs);
  }

  async function pollMetrics() {
    let grew = false;
    for (const run of state.info.runs) {
      const m = state.metrics[run.id];
      const got = await api("/api/metrics", { run: run.id, since: m.next, generation: m.generation });
      m.records = got.reset ? got.records : m.records.concat(got.records);
      grew = grew || got.reset || got.records.length > 0;
      Object.assign(m, { next: got.next, generation: got.generation, skipped: got.skipped_lines,
        truncated: got.truncated_tail });
    }
    if (grew) {
      drawCharts();
      loadHealth();
      const typing = document.getElementById("sample-filters").contains(document.activeElement);
      if (state.metrics[0].generation >= 0 && !typing && document.body.hasAttribute("data-ready")) {
        loadSamples(sampleOffset);  // new rows of the sample log, unless a filter is being edited
      }
    }
    const m = state.metrics[state.run] || { records: [] };
    const last = m.records.length ? m.records[m.records.length - 1].step : "none";
    document.getElementById("status").textContent = (INLINE ? "exported " + INLINE.exported_at : "live") +
      " · last step " + last + (m.skipped ? ` · ${m.skipped} unreadable line(s) skipped` : "") +
      (m.truncated ? " · an unfinished last line" : "");
  }

  // ------------------------------------------------------------------ health
  function runPicker(target) {
    const sel = el("select", { class: "run-picker" }, state.info.runs.map((r) =>
      el("option", { value: r.id, selected: r.id === state.run }, "run: " + r.label)));
    sel.onchange = () => { state.run = +sel.value; setQuery({ run: state.run || "" }); loadHealth(); loadSamples(0); };
    document.getElementById(target).replaceChildren(sel);
  }

  async function loadHealth() {
    const h = await api("/api/health", { run: state.run });
    const rows = h.alarms.map((a) => el("tr", { class: "level-" + a.level },
      el("td", {}, el("span", { class: "badge " + a.level }, a.level)), el("td", {}, a.name), el("td", {}, a.figure),
      el("td", {}, a.step === null ? "" : "step " + a.step), el("td", { class: "detail" }, a.detail)));
    const ckpts = h.checkpoints.map((c) => el("tr", { class: c.ok ? "level-ok" : "level-alarm" },
      el("td", {}, el("span", { class: "badge " + (c.ok ? "ok" : "alarm") }, c.ok ? "verifies" : "damaged")),
      el("td", {}, c.name), el("td", {}, (c.bytes / 1e6).toFixed(1) + " MB"),
      el("td", {}, c.manifest ? "manifest" : "no manifest"), el("td", { class: "detail" }, c.error)));
    document.getElementById("health-body").replaceChildren(
      el("h2", {}, "Alarms"), rows.length ? el("table", { id: "alarms" }, rows) : el("p", { class: "empty" }, "no metrics yet"),
      el("h2", {}, "Checkpoints"),
      ckpts.length ? el("table", { id: "checkpoints" }, ckpts) : el("p", { class: "empty" }, "no checkpoints"));
  }

  // ------------------------------------------------------------------ samples
  let sampleOffset = +(query.get("offset") || 0);
  let indexPoll = null;

  function filterForm(facets) {
    const form = document.getElementById("sample-filters");
    const value = (f) => query.get(f) || "";
    const select = (f, options) => el("select", { name: f },
      el("option", { value: "" }, f + ": any"),
      Object.entries(options || {}).map(([v, n]) => el("option", { value: v, selected: v === value(f) }, `${v || "(none)"} (${n})`)));
    const input = (f, type, ph) => el("input", { name: f, type, placeholder: ph || f, value: value(f), size: 7 });
    form.replaceChildren(
      input("step", "number"), input("step_min", "number"), input("step_max", "number"),
      select("data_source", facets.data_source), select("verifier", facets.verifier), select("verdict", facets.verdict),
      input("reason", "text", "reason contains"), input("reward_min", "number"), input("reward_max", "number"),
      input("len_min", "number"), input("len_max", "number"), el("button", { type: "submit" }, "filter"));
    form.querySelectorAll("input[type=number]").forEach((i) => i.setAttribute("step", "any"));
    form.onsubmit = (e) => {
      e.preventDefault();
      const data = new FormData(form);
      setQuery(Object.fromEntries(FILTERS.map((f) => [f, data.get(f) || ""])));
      loadSamples(0);
    };
  }

  function turns(text) {
    const parts = text.split(/^\[(\w+)\]\n/m);
    const out = [];
    for (let i = 1; i < parts.length; i += 2) out.push(el("div", { class: "turn role-" + parts[i] }, el("b", {}, parts[i]), el("pre", {}, parts[i + 1])));
    return out.length ? out : [el("pre", {}, text)];
  }

  function sampleCard(r) {
    const len = Number.isInteger(r.response_tokens) ? r.response_tokens + " tokens" : (r.response || "").length + " chars";
    const gt = r.ground_truth === undefined || r.ground_truth === null ? "(not logged)" :
      typeof r.ground_truth === "string" ? r.ground_truth : JSON.stringify(r.ground_truth, null, 1);
    return el("article", { class: "sample verdict-" + r.verdict },
      el("div", { class: "meta" }, el("span", { class: "badge " + r.verdict }, r.verdict), ` step ${r.step}`,
        r.data_source ? ` · ${r.data_source}` : "", r.verifier ? ` · verifier ${r.verifier}` : "",
        ` · reward ${r.reward}`, ` · ${len}`, r.finish_reason ? ` · finish ${r.finish_reason}` : "",
        Number.isInteger(r.weights_version) ? ` · weights v${r.weights_version}` +
          (Number.isInteger(r.newest_version) ? `\u2013v${r.newest_version}` : "") : "",
        INLINE || !r.prompt_key ? "" : el("a", { class: "across", href: `/prompt?run=${state.run}&key=${r.prompt_key}` },
          "this prompt across steps")),
      el("div", { class: "reason" }, "reason: ", el("q", {}, r.reason || "")),
      el("details", { open: true }, el("summary", {}, "prompt"), el("pre", {}, r.prompt || "")),
      r.conversation ? el("details", { open: true, class: "conversation" }, el("summary", {}, "response (turns)"), turns(r.conversation))
        : el("details", { open: true }, el("summary", {}, "response"), el("pre", {}, r.response)),
      el("div", { class: "truth" }, "ground truth: ", el("code", {}, gt)));
  }

  async function loadSamples(offset) {
    sampleOffset = offset;
    setQuery({ offset: offset || "" });
    const params = { run: state.run, offset, limit: 20 };
    FILTERS.forEach((f) => { if (query.get(f)) params[f] = query.get(f); });
    let page;
    try {
      page = await api("/api/samples", params);
    } catch (err) {
      document.getElementById("sample-summary").textContent = "error: " + err.message;
      return;
    }
    filterForm(page.facets);
    const indexing = page.indexing && page.indexing.building ?
      (page.indexing.lines_total ? ` · indexing ${page.indexing.lines_done} of ${page.indexing.lines_total} rows`
        : " · indexing: counting the rows") : "";
    document.getElementById("sample-summary").textContent = `${page.total} of ${page.rows_in_log} samples match` +
      (page.total ? `; showing ${page.offset + 1}–${page.offset + page.rows.length}` : "") +
      (page.skipped_lines ? ` · ${page.skipped_lines} line(s) of another shape skipped` : "") + indexing;
    clearTimeout(indexPoll);  // while the index is built, the counts and pages grow: ask again each second
    if (indexing) indexPoll = setTimeout(function again() {
      if (sampleOffset !== offset) return;  // another page was asked for meanwhile: it polls itself
      const typing = document.getElementById("sample-filters").contains(document.activeElement);
      if (typing) indexPoll = setTimeout(again, 1000); else loadSamples(offset);  // not under a filter being edited
    }, 1000);
    document.getElementById("sample-rows").replaceChildren(...page.rows.map(sampleCard));
    const prev = el("button", { disabled: offset <= 0 }, "← previous"), next = el("button", { disabled: offset + page.limit >= page.total }, "next →");
    prev.onclick = () => loadSamples(Math.max(0, offset - page.limit));
    next.onclick = () => loadSamples(offset + page.limit);
    document.getElementById("sample-pager").replaceChildren(prev, next);
  }

  // ------------------------------------------------------------------ start
  async function start() {
    state.info = await api("/api/runs");
    if (!state.info.runs[state.run]) state.run = 0;
    state.metrics = state.info.runs.map(() => ({ records: [], next: 0, generation: -1 }));
    curveControls();
    runPicker("health-run");
    await pollMetrics();
    drawCharts();
    await Promise.all([loadHealth(), loadSamples(sampleOffset)]);
    document.body.setAttribute("data-ready", "1");
    if (!INLINE) setInterval(() => pollMetrics().catch((e) => { document.getElementById("status").textContent = "offline: " + e.message; }), 2000);
  }
  start().catch((err) => { document.getElementById("status").textContent = "error: " + err.message; });
})();
