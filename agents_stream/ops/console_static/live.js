// The console's live views: this worker's counters (/readyz, /metrics), every worker's charts (/samples, drawn by
// charts.js) and the shared breakers (/circuits).
"use strict";

(() => {
  const C = window.AgentsStreamConsole;
  const { el, show, when, number, api, problem } = C;
  const $ = (id) => document.getElementById(id);

  // -- live counters ---------------------------------------------------------------------------------------------------

  function card(label, value, detail, alert) {
    return el("div", { cls: "card" + (alert ? " alert" : "") },
      el("div", { cls: "label", text: label }),
      el("div", { cls: "value", text: value }),
      detail ? el("div", { cls: "detail", text: detail, title: detail }) : null);
  }

  async function pollReady() {
    const r = await api("GET", "/readyz");
    const status = $("ready-status");
    const cards = $("ready-cards");
    $("updated-at").textContent = "updated " + new Date().toLocaleTimeString();
    if (r.data && typeof r.data.status === "string") {
      status.textContent = r.data.status;
      status.className = "badge " + (r.data.status === "ready" ? "ok" : "warn");
      if (r.data.worker) $("worker-id").textContent = String(r.data.worker);
    } else {
      status.textContent = r.status === 0 ? "unreachable" : `HTTP ${r.status}`;
      status.className = "badge bad";
    }
    if (r.ok && r.data) {
      const down = Array.isArray(r.data.providers_down) ? r.data.providers_down.map(String) : [];
      cards.replaceChildren(
        card("in flight", number(r.data.in_flight), "provider calls running now"),
        card("queued", number(r.data.queued), "waiting for a call slot"),
        card("held", number(r.data.held), "no provider available", r.data.held > 0),
        card("providers down", String(down.length), down.length ? down.join(", ") : "all available", down.length > 0),
      );
    }
    await pollMetrics();
  }

  // Prometheus text format: `name{label="value",...} number [timestamp]`.
  function parseMetrics(text) {
    const samples = [];
    for (const line of text.split("\n")) {
      if (!line || line.startsWith("#")) continue;
      const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
      if (!m) continue;
      const labels = {};
      if (m[2]) {
        for (const lm of m[2].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) {
          labels[lm[1]] = lm[2].replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
        }
      }
      const value = Number(m[3]);
      if (!Number.isNaN(value)) samples.push({ name: m[1], labels, value });
    }
    return samples;
  }

  function total(samples, name, keep) {
    return samples.filter((s) => s.name === name && (!keep || keep(s.labels))).reduce((a, s) => a + s.value, 0);
  }

  function byLabel(samples, name, label) {
    const out = {};
    for (const s of samples) if (s.name === name) out[s.labels[label]] = (out[s.labels[label]] || 0) + s.value;
    return Object.entries(out).filter(([, v]) => v > 0).map(([k, v]) => `${k} ${Math.round(v)}`).join(" · ");
  }

  async function pollMetrics() {
    const r = await api("GET", "/metrics");
    const cards = $("metric-cards");
    if (!r.ok) {
      cards.replaceChildren(card("metrics", "–", problem(r)));
      return;
    }
    const s = parseMetrics(r.text);
    const calls = "agents_stream_provider_calls_total";
    const answers = "agents_stream_answers_total";
    const failedCalls = total(s, calls, (l) => l.outcome !== "success");
    cards.replaceChildren(
      card("provider calls", number(total(s, calls)), byLabel(s, calls, "outcome") || "none yet", false),
      card("failed calls", number(failedCalls), "failure, rate limited, rejected", failedCalls > 0),
      card("results", number(total(s, answers)), byLabel(s, answers, "status") || "none yet"),
      card("tokens", number(total(s, "agents_stream_tokens_total")), byLabel(s, "agents_stream_tokens_total", "direction")),
      card("cost (USD)", number(total(s, "agents_stream_cost_usd_total"), 4), "from the price table"),
      card("format retries", number(total(s, "agents_stream_format_retries_total")), "outputs off schema"),
      card("breaker opens", number(total(s, "agents_stream_breaker_opens")), "since the log's start"),
    );
  }

  // -- charts ----------------------------------------------------------------------------------------------------------

  // Every worker's samples on one time grid (GET /samples), drawn by charts.js.
  const LINES = [
    ["chart-throughput", "ended_per_s", { digits: 1, unit: "tasks/s" }],
    ["chart-lag", "lag", { unit: "records" }],
    ["chart-in-flight", "in_flight", { unit: "calls" }],
    ["chart-held", "held", { unit: "tasks" }],
  ];
  let lastSamples = null;

  // The time axis: the range chosen, but no older than the first sample (a young cluster fills the width),
  // and never shorter than MIN_SPAN_S or 15 samples.
  const MIN_SPAN_S = 30;

  function shownFrom(data) {
    const t = data.series.t;
    const workers = Array.isArray(data.series.workers) ? data.series.workers : [];
    const last = t[t.length - 1];
    const first = workers.findIndex((n) => n > 0);
    const range = Number($("charts-range").value) || 600;
    const span = Math.min(range, Math.max(first < 0 ? 0 : last - t[first], MIN_SPAN_S, 15 * (data.interval_s || 2)));
    const from = t.findIndex((ti) => ti >= last - span);
    return from < 0 ? 0 : from;
  }

  function drawCharts() {
    const data = lastSamples;
    const charts = window.AgentsStreamCharts;
    if (!data || !charts) return;
    const from = shownFrom(data);
    const t = data.series.t.slice(from);
    for (const [id, key, opts] of LINES) {
      const values = Array.isArray(data.series[key]) ? data.series[key].slice(from) : [];
      charts.line($(id), t, values, opts);
    }
    const states = {};
    for (const [name, column] of Object.entries(data.breakers || {})) {
      if (Array.isArray(column)) states[name] = column.slice(from);
    }
    charts.breakers($("chart-breakers"), t, states);
    // A held task is the alert of the hour: its chart says so in red while any is held.
    const held = $("chart-held").dataset.last;
    $("chart-held").classList.toggle("alert", Number(held) > 0);
  }

  async function refreshCharts() {
    const r = await api("GET", "/samples");
    const error = $("charts-error");
    const d = r.data;
    if (!r.ok || !d || !d.series || !Array.isArray(d.series.t) || !d.series.t.length) {
      error.textContent = "Could not load the charts: " + problem(r);
      show(error, true);
      return;
    }
    const unreachable = Array.isArray(d.unreachable) ? d.unreachable.map(String) : [];
    error.textContent = unreachable.length ? "Not answering, their samples are missing: " + unreachable.join(", ") : "";
    show(error, unreachable.length > 0);
    const workers = Array.isArray(d.workers) ? d.workers.length : 0;
    $("charts-workers").textContent = `· ${workers} worker${workers === 1 ? "" : "s"}, a sample every ${number(d.interval_s, 1)} s`;
    lastSamples = d;
    drawCharts();
  }

  // -- breakers --------------------------------------------------------------------------------------------------------

  async function refreshBreakers() {
    const r = await api("GET", "/circuits");
    const error = $("breakers-error");
    if (!r.ok || !r.data || typeof r.data.providers !== "object" || r.data.providers === null) {
      error.textContent = "Could not load breakers: " + problem(r);
      show(error, true);
      return;
    }
    show(error, false);
    const rows = Object.entries(r.data.providers).map(([name, c]) => {
      const state = String(c.state ?? "unknown");
      const until = c.reopens_at ? "half-open at " + when(c.reopens_at)
        : c.retry_after_until ? "Retry-After until " + when(c.retry_after_until) : "";
      const cap = c.concurrency_limit_here;
      const limit = typeof cap !== "number" ? "∞" : Number.isInteger(cap) ? String(cap) : cap.toFixed(1);
      const workers = typeof c.live_workers === "number" ? `${c.live_workers} worker${c.live_workers === 1 ? "" : "s"}` : "";
      return el("tr", { data: { provider: name } },
        el("td", { title: String(c.endpoint ?? "") }, el("code", { text: name })),
        el("td", {}, el("span", { cls: "badge state-" + state.replace(/[^a-z_]/g, ""), text: state.replace("_", "-") }),
          until ? el("div", { cls: "muted small", text: until }) : null),
        el("td", { cls: "num", text: `${number(c.failures_in_window)} / ${number(c.total_failures)}` }),
        el("td", { cls: "num", text: number(c.opens) }),
        el("td", { cls: "num" }, `${number(c.in_flight_here)} / ${limit}`, el("div", { cls: "muted small", text: workers })),
      );
    });
    $("breakers-body").replaceChildren(...rows);
    show($("breakers-empty"), rows.length === 0);
  }

  Object.assign(C, { pollReady, drawCharts, refreshCharts, refreshBreakers });
})();
