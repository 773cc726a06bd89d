// The operator console: plain JS, no build step, no dependencies.
//
// Everything the API returns (task ids, reasons, instructions, outputs) is untrusted: it reaches the page only
// through textContent / text nodes, never innerHTML. The API token lives in sessionStorage (this tab only, gone
// when it closes), is sent only as an Authorization header, and never appears in a URL.
"use strict";

(() => {
  const TOKEN_KEY = "agents-stream.token";
  const OPERATOR_KEY = "agents-stream.operator";
  const TIMEOUT_MS = 10000;
  const READY_EVERY_MS = 3000;
  const APPROVALS_EVERY_MS = 4000;
  const BREAKERS_EVERY_MS = 5000;
  const SAMPLES_EVERY_MS = 3000;
  const RECENT_EVERY_MS = 4000;
  const RECENT_LIMIT = 50;
  const RETRY_DECIDED_AFTER_MS = 20000; // a decision sent but still parked after this: offer the buttons again

  const $ = (id) => document.getElementById(id);

  // -- DOM helpers: text only ------------------------------------------------------------------------------------

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    const p = props || {};
    if (p.cls) node.className = p.cls;
    if (p.text !== undefined && p.text !== null) node.textContent = String(p.text);
    if (p.title) node.title = String(p.title);
    if (p.type) node.type = p.type;
    if (p.data) for (const [k, v] of Object.entries(p.data)) node.dataset[k] = String(v);
    if (p.attrs) for (const [k, v] of Object.entries(p.attrs)) node.setAttribute(k, String(v));
    if (p.on) for (const [event, fn] of Object.entries(p.on)) node.addEventListener(event, fn);
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function show(node, visible) { node.hidden = !visible; }

  function clip(value, n) {
    const s = typeof value === "string" ? value : JSON.stringify(value);
    if (s === undefined || s === null) return "";
    return s.length > n ? s.slice(0, n - 1) + "…" : s;
  }

  function when(epochSeconds) {
    if (typeof epochSeconds !== "number") return "";
    return new Date(epochSeconds * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
  }

  function ago(epochSeconds) {
    if (typeof epochSeconds !== "number") return "";
    const s = Math.max(0, Math.round(Date.now() / 1000 - epochSeconds));
    if (s < 90) return `${s} s`;
    if (s < 5400) return `${Math.round(s / 60)} min`;
    return `${(s / 3600).toFixed(1)} h`;
  }

  function number(v, digits) {
    if (typeof v !== "number" || Number.isNaN(v)) return "–";
    return digits === undefined ? String(Math.round(v)) : v.toFixed(digits);
  }

  // -- token and operator ------------------------------------------------------------------------------------------

  function stored(key) {
    try { return sessionStorage.getItem(key) || ""; } catch (e) { return ""; }
  }

  function store(key, value) {
    try {
      if (value) sessionStorage.setItem(key, value); else sessionStorage.removeItem(key);
    } catch (e) { /* storage disabled: the value lasts until the page reloads */ }
  }

  const token = () => stored(TOKEN_KEY);
  const operator = () => $("operator").value.trim();

  function renderTokenState() {
    const state = $("token-state");
    const set = Boolean(token());
    state.textContent = set ? "token set (this tab)" : "no token";
    state.className = "badge " + (set ? "ok" : "warn");
  }

  function useToken() {
    const input = $("token");
    const value = input.value.trim();
    input.value = ""; // the input is not where it is kept
    if (!value) {
      notify("error", "Type the API token first (AGENTS_STREAM_API_TOKEN of the workers; AGENTS_STREAM_READ_TOKEN only reads).");
      return;
    }
    store(TOKEN_KEY, value);
    renderTokenState();
    notify("ok", "Token kept for this tab only; reads and decisions now carry it.");
    // Task data needs the token: show it now rather than at the next poll.
    refreshApprovals();
    refreshBreakers();
    refreshCharts();
    refreshRecent();
    document.dispatchEvent(new CustomEvent("agents-stream:token"));
  }

  function forgetToken() {
    store(TOKEN_KEY, "");
    $("token").value = "";
    renderTokenState();
    notify("ok", "Token forgotten.");
  }

  // -- notices -------------------------------------------------------------------------------------------------------

  let noticeTimer = null;

  function notify(kind, message) {
    const box = $("notice");
    $("notice-text").textContent = message;
    box.className = kind;
    box.hidden = false;
    clearTimeout(noticeTimer);
    // A refusal stays until dismissed: the operator must see that nothing happened.
    if (kind === "ok") noticeTimer = setTimeout(() => { box.hidden = true; }, 6000);
  }

  // -- HTTP ------------------------------------------------------------------------------------------------------------

  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    const t = token();
    if (t) headers.Authorization = "Bearer " + t;
    const init = { method, headers, cache: "no-store", credentials: "same-origin", referrerPolicy: "no-referrer" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), TIMEOUT_MS);
    try {
      const resp = await fetch(path, { ...init, signal: ctl.signal });
      const text = await resp.text();
      let data = null;
      if ((resp.headers.get("Content-Type") || "").includes("json")) {
        try { data = JSON.parse(text); } catch (e) { data = null; }
      }
      return { ok: resp.ok, status: resp.status, data, text };
    } catch (e) {
      const text = e && e.name === "AbortError" ? `no answer within ${TIMEOUT_MS / 1000} s` : String((e && e.message) || e);
      return { ok: false, status: 0, data: null, text };
    } finally {
      clearTimeout(timer);
    }
  }

  const refused = (r) => r.status === 401 || r.status === 403;

  function problem(r) {
    const detail = r.data && typeof r.data.error === "string" ? r.data.error : clip(r.text.trim(), 300);
    if (r.status === 0) return `Worker unreachable: ${detail}`;
    if (refused(r)) {
      const hint = token() ? "the token was not accepted" : "no API token is set: enter it at the top";
      return `Refused (${r.status}): ${hint}. ${detail}`;
    }
    return `HTTP ${r.status}: ${detail}`;
  }

  // A mutation's failure goes to the row that asked and to the banner.
  function reportFailure(r, what) {
    const message = `${what}: ${problem(r)}`;
    notify(refused(r) ? "refused" : "error", message);
    return message;
  }

  // -- polling ---------------------------------------------------------------------------------------------------------

  // Each poll reschedules itself after it finished, so a slow worker never gets overlapping requests.
  function every(ms, fn) {
    const loop = async () => {
      try { await fn(); } catch (e) { console.warn("console poll failed", e); }
      setTimeout(loop, ms);
    };
    loop();
  }

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

  // -- recent tasks and jobs -------------------------------------------------------------------------------------------

  const TASK_STATE = {
    succeeded: "ok", running: "info", held: "bad", awaiting_approval: "warn", awaiting_subtasks: "warn",
    failed: "bad", dead_lettered: "bad", rejected: "bad", cancelled: "",
  };
  const JOB_STATE = { planning: "info", running: "info", succeeded: "ok", partial: "warn", failed: "bad" };
  const ACTIVE = new Set(["running", "held", "awaiting_approval", "awaiting_subtasks"]);
  const PROBLEM = new Set(["failed", "dead_lettered", "rejected", "cancelled"]);
  let lastRecent = null;

  function stateBadge(state, classes) {
    const s = String(state ?? "unknown");
    return el("span", { cls: "badge " + (classes[s] ?? ""), text: s.replace("_", " "), data: { state: s } });
  }

  function shortWorker(w) {
    const parts = String(w ?? "").split(":");
    return parts[parts.length - 1];
  }

  function openTask(taskId) {
    $("task-id").value = taskId;
    showTask().then(() => $("lookup").scrollIntoView({ block: "start" }));
  }

  function openJob(jobId) {
    $("job-id").value = jobId;
    showJob().then(() => $("lookup").scrollIntoView({ block: "start" }));
  }

  function linkButton(text, onClick, title) {
    return el("button", { cls: "link-button", type: "button", title, on: { click: onClick } }, el("code", { text }));
  }

  function recentTaskRow(t) {
    const state = t.held ? "held" : String(t.state ?? "");
    const id = String(t.task_id);
    return el("tr", { data: { recentTask: id, state } },
      el("td", { text: ago(t.at), title: `${when(t.at)} · worker ${t.worker ?? ""}` }),
      el("td", { cls: "task" }, linkButton(id, () => openTask(id), "show this task (record, transcript)")),
      el("td", { text: t.agent ?? "" }),
      el("td", {}, stateBadge(state, TASK_STATE)),
      el("td", { cls: "num", text: number(t.dispatch) }),
      el("td", {}, t.job_id ? linkButton(String(t.job_id), () => openJob(String(t.job_id)), "show this job") : null),
    );
  }

  function recentJobRow(j) {
    const id = String(j.job_id);
    return el("tr", { data: { recentJob: id, state: String(j.state ?? "") } },
      el("td", { text: ago(j.at), title: `${when(j.at)} · worker ${shortWorker(j.worker)}` }),
      el("td", {}, linkButton(id, () => openJob(id), j.goal ? `goal: ${j.goal}` : "show this job")),
      el("td", {}, stateBadge(j.state, JOB_STATE)),
      el("td", { cls: "num", text: `${number(j.steps_done)} / ${number(j.steps)}` }),
    );
  }

  function drawRecent() {
    const d = lastRecent;
    if (!d) return;
    const filter = $("recent-state").value;
    const tasks = d.tasks.filter((t) => {
      const state = t.held ? "held" : String(t.state);
      if (filter === "active") return ACTIVE.has(state);
      if (filter === "problem") return PROBLEM.has(state);
      return !filter || state === filter;
    });
    $("recent-body").replaceChildren(...tasks.map(recentTaskRow));
    const count = $("recent-count");
    count.textContent = String(tasks.length);
    count.className = "badge " + (tasks.some((t) => t.held || PROBLEM.has(String(t.state))) ? "warn" : "ok");
    show($("recent-table"), tasks.length > 0);
    show($("recent-empty"), tasks.length === 0);
    $("recent-jobs-body").replaceChildren(...d.jobs.map(recentJobRow));
    $("recent-jobs-count").textContent = String(d.jobs.length);
    show($("recent-jobs-table"), d.jobs.length > 0);
    show($("recent-jobs-empty"), d.jobs.length === 0);
  }

  async function refreshRecent() {
    const r = await api("GET", "/recent?limit=" + RECENT_LIMIT);
    const error = $("recent-error");
    if (!r.ok || !r.data || !Array.isArray(r.data.tasks) || !Array.isArray(r.data.jobs)) {
      error.textContent = "Could not load the recent tasks: " + problem(r);
      show(error, true);
      return;
    }
    const unreachable = Array.isArray(r.data.unreachable) ? r.data.unreachable.map(String) : [];
    error.textContent = unreachable.length ? "Not answering, their tasks are missing: " + unreachable.join(", ") : "";
    show(error, unreachable.length > 0);
    lastRecent = r.data;
    drawRecent();
    // The conversation view (conversations.js) lists the conversations whose rounds are among these tasks.
    document.dispatchEvent(new CustomEvent("agents-stream:recent", { detail: r.data }));
  }

  // -- approvals inbox -------------------------------------------------------------------------------------------------

  const approvalRows = new Map(); // task_id -> <tr>, kept across polls so a half-typed comment survives a refresh

  function rowStatus(row, kind, message) {
    const status = row.querySelector(".row-status");
    status.textContent = message;
    status.className = "row-status " + kind;
  }

  function approvalRow(item) {
    const taskId = String(item.task_id);
    const comment = el("input", { cls: "comment", type: "text", attrs: { placeholder: "comment (optional)", maxlength: "500", autocomplete: "off" } });
    const approve = el("button", { cls: "approve", type: "button", text: "Approve", on: { click: () => decide(row, taskId, "approve") } });
    const reject = el("button", { cls: "reject", type: "button", text: "Reject", on: { click: () => decide(row, taskId, "reject") } });
    const row = el("tr", { data: { taskId } },
      el("td", { cls: "task" }, el("code", { text: taskId }), el("div", { cls: "agent muted small" })),
      el("td", { cls: "level" }, el("span", { cls: "level-name" }), el("div", { cls: "why muted small" })),
      el("td", { cls: "instruction" }),
      el("td", { cls: "waiting" }),
      el("td", {}, el("div", { cls: "decision" }, comment, approve, reject, el("span", { cls: "row-status" }))),
    );
    return row;
  }

  function updateApprovalRow(row, item) {
    const cell = (cls) => row.querySelector("td." + cls);
    // A decision names what this row shows: the parking, the app id and the agent. A task that parked again (an
    // agent loop's next guarded call) is a new request: its earlier decision was applied, its buttons come back.
    const parked = String(item.parked ?? "");
    if (row.dataset.parked && row.dataset.parked !== parked && row.dataset.sentAt) {
      delete row.dataset.sentAt;
      row.classList.remove("decided");
      for (const b of row.querySelectorAll("button")) b.disabled = false;
      rowStatus(row, "", "A new request: the task parked again after the last decision.");
    }
    row.dataset.parked = parked;
    row.dataset.agent = String(item.agent ?? "");
    row.dataset.appId = String(item.app_id ?? "");
    row.querySelector(".agent").textContent = String(item.agent ?? "");
    row.querySelector(".level-name").textContent = `${item.level ?? ""}${item.level_name ? " · " + item.level_name : ""}`;
    row.querySelector(".why").textContent = String(item.reason ?? "");
    const instruction = cell("instruction");
    instruction.textContent = clip(String(item.instruction ?? ""), 160);
    const ctx = item.context_data && Object.keys(item.context_data).length ? "context: " + clip(item.context_data, 400) : "";
    instruction.title = ctx;
    cell("waiting").textContent = ago(item.requested_at);
    cell("waiting").title = (item.requested_at ? "since " + when(item.requested_at) : "") + (item.due ? ", level due " + when(item.due) : "");
    const sent = Number(row.dataset.sentAt || 0);
    if (sent && Date.now() - sent > RETRY_DECIDED_AFTER_MS) {
      delete row.dataset.sentAt;
      row.classList.remove("decided");
      for (const b of row.querySelectorAll("button")) b.disabled = false;
      rowStatus(row, "error", "Still waiting: the decision has not been applied yet; you may send it again.");
    }
  }

  async function decide(row, taskId, decision) {
    const by = operator();
    if (!by) {
      rowStatus(row, "error", "Enter your operator name at the top first.");
      $("operator").focus();
      return;
    }
    const buttons = row.querySelectorAll("button");
    for (const b of buttons) b.disabled = true;
    rowStatus(row, "", `sending ${decision}…`);
    const comment = row.querySelector("input.comment").value.trim();
    // what the row displayed: the worker refuses the decision (409, with why) if the task is parked elsewhere now
    const body = { decision, by, parked: Number(row.dataset.parked), agent: row.dataset.agent, app_id: row.dataset.appId };
    if (comment) body.comment = comment;
    const r = await api("POST", "/approvals/" + encodeURIComponent(taskId), body);
    if (r.ok) {
      row.dataset.sentAt = String(Date.now());
      row.classList.add("decided");
      rowStatus(row, "ok", `${decision === "approve" ? "Approved" : "Rejected"} by ${by}; the ledger applies it in a moment.`);
      notify("ok", `${decision} of ${taskId} accepted (HTTP ${r.status}).`);
      setTimeout(refreshApprovals, 1500);
      return;
    }
    for (const b of buttons) b.disabled = false;
    rowStatus(row, refused(r) ? "refused" : "error", reportFailure(r, `${decision} ${taskId}`));
  }

  async function refreshApprovals() {
    const r = await api("GET", "/approvals");
    const error = $("approvals-error");
    if (!r.ok || !r.data || !Array.isArray(r.data.awaiting)) {
      error.textContent = "Could not load approvals: " + problem(r);
      show(error, true);
      return;
    }
    // Each worker knows the approvals of its own partitions; one that did not answer hides its share.
    const unreachable = Array.isArray(r.data.unreachable) ? r.data.unreachable.map(String) : [];
    error.textContent = unreachable.length ? "Not answering, their approvals are missing: " + unreachable.join(", ") : "";
    show(error, unreachable.length > 0);
    const list = r.data.awaiting;
    const body = $("approvals-body");
    const seen = new Set();
    list.forEach((item, i) => {
      const taskId = String(item.task_id);
      seen.add(taskId);
      let row = approvalRows.get(taskId);
      if (!row) {
        row = approvalRow(item);
        approvalRows.set(taskId, row);
      }
      updateApprovalRow(row, item);
      // Move a row only when it is out of place: moving it would take the focus out of its comment box.
      if (body.children[i] !== row) body.insertBefore(row, body.children[i] || null);
    });
    for (const [taskId, row] of approvalRows) {
      if (!seen.has(taskId)) {
        row.remove();
        approvalRows.delete(taskId);
      }
    }
    const count = $("approvals-count");
    count.textContent = String(list.length);
    count.className = "badge " + (list.length ? "warn" : "ok");
    show($("approvals-empty"), list.length === 0);
    show($("approvals-table"), list.length > 0);
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

  // -- dead letters ----------------------------------------------------------------------------------------------------

  let dlqFilters = null; // the query of the page shown, so "Older" pages through the same filters

  async function loadDeadLetters(event) {
    if (event) event.preventDefault();
    const params = new URLSearchParams();
    for (const name of ["agent", "layer", "reason"]) {
      const v = $("dlq-" + name).value.trim();
      if (v) params.set(name, v);
    }
    const limit = parseInt($("dlq-limit").value, 10);
    params.set("limit", String(Number.isFinite(limit) && limit > 0 ? Math.min(limit, 1000) : 50));
    dlqFilters = params.toString();
    $("dlq-body").replaceChildren();
    await loadDeadLetterPage(params);
  }

  async function olderDeadLetters() {
    const older = $("dlq-older");
    if (dlqFilters === null || !older.dataset.next) return;
    const params = new URLSearchParams(dlqFilters);
    params.set("before", older.dataset.next);
    await loadDeadLetterPage(params);
  }

  // One page, newest first; "Older" appends the next one (the worker reads a page, never a whole topic).
  async function loadDeadLetterPage(params) {
    const older = $("dlq-older");
    show(older, false);
    const message = $("dlq-message");
    message.className = "muted";
    message.textContent = "Loading…";
    const r = await api("GET", "/dlq?" + params.toString());
    if (r.status === 404 && !(r.data && Array.isArray(r.data.dead_letters))) {
      message.className = "error";
      message.textContent = "This worker has no dead-letter browser (GET /dlq answered 404); use `agents-stream dlq list`.";
      show($("dlq-table"), false);
      return;
    }
    if (!r.ok || !r.data || !Array.isArray(r.data.dead_letters)) {
      message.className = "error";
      message.textContent = "Could not list dead letters: " + problem(r);
      show($("dlq-table"), false);
      return;
    }
    const body = $("dlq-body");
    body.append(...r.data.dead_letters.map(deadLetterRow));
    message.className = "muted";
    const count = body.children.length;
    const next = typeof r.data.next === "string" ? r.data.next : "";
    const total = typeof r.data.total === "number" ? ` of ${r.data.total} in the topics` : "";
    message.textContent = count === 0 && !next ? "No dead letters match."
      : `${count} dead letter${count === 1 ? "" : "s"} shown, newest first${total}${next ? "; older ones follow" : ""}.`;
    older.dataset.next = next;
    show(older, Boolean(next));
    show($("dlq-table"), count > 0);
  }

  function deadLetterRow(d) {
    const ref = `${d.topic}:${d.partition}:${d.offset}`;
    const status = el("span", { cls: "row-status" });
    const button = el("button", { cls: "secondary small", type: "button", text: "Requeue" });
    const row = el("tr", { data: { ref } },
      el("td", { text: String(d.failed_at ?? "").replace("T", " ").replace(/\.\d+Z$/, "Z"), title: d.failed_at ?? "" }),
      el("td", {}, el("code", { text: d.task_id ?? "–" }), el("div", { cls: "muted small", text: d.agent ?? "" })),
      el("td", {}, String(d.error_layer ?? ""), el("div", { cls: "muted small", text: clip(d.reason ?? "", 200), title: d.reason ?? "" })),
      el("td", { cls: "num", text: d.attempts ?? "" }),
      el("td", {}, el("code", { text: ref })),
      el("td", {}, button, status),
    );
    button.addEventListener("click", async () => {
      button.disabled = true;
      rowStatus(row, "", "requeueing…");
      const r = await api("POST", "/dlq/requeue", { topic: d.topic, partition: d.partition, offset: d.offset });
      if (r.ok) {
        rowStatus(row, "ok", "requeued");
        notify("ok", `Requeued ${ref} (HTTP ${r.status}).`);
        return;
      }
      button.disabled = false;
      rowStatus(row, refused(r) ? "refused" : "error", reportFailure(r, `requeue ${ref}`));
    });
    return row;
  }

  // -- task and job lookup ---------------------------------------------------------------------------------------------

  let shownJob = null;

  function summary(pairs) {
    const dl = $("lookup-summary");
    dl.replaceChildren();
    for (const [k, v] of pairs) {
      if (v === undefined || v === null || v === "") continue;
      dl.append(el("dt", { text: k }), el("dd", { text: typeof v === "string" ? v : JSON.stringify(v) }));
    }
  }

  function lookupFailed(what, r) {
    show($("lookup-result"), false);
    const message = $("lookup-message");
    message.className = "error";
    if (r.status === 404 && r.data && typeof r.data.error === "string") message.textContent = `${what}: not found (${r.data.error})`;
    else if (r.status === 404) message.textContent = `${what}: this worker does not serve that lookup (HTTP 404; jobs may be off here)`;
    else message.textContent = `${what}: ${problem(r)}`;
  }

  async function showTask(event) {
    if (event) event.preventDefault();
    const taskId = $("task-id").value.trim();
    if (!taskId) return;
    const r = await api("GET", "/tasks/" + encodeURIComponent(taskId));
    if (!r.ok || !r.data) return lookupFailed(`task ${taskId}`, r);
    const t = r.data;
    shownJob = null;
    $("lookup-title-text").textContent = "Task " + taskId;
    const result = t.result || {};
    const approval = t.approval || {};
    summary([
      ["state", t.state], ["agent", t.agent], ["dispatches", t.dispatch], ["owner", t.owner],
      ["result", result.status ? `${result.status}${result.confidence ? " · " + result.confidence : ""}${result.source ? " · " + result.source : ""}` : ""],
      ["error", result.error], ["output", result.output !== undefined ? clip(result.output, 600) : ""],
      ["approval", Object.keys(approval).length ? clip(approval, 400) : ""],
      ["source", t.source ? `${t.source.topic}:${t.source.partition}:${t.source.offset}` : ""],
    ]);
    show($("job-steps"), false);
    show($("job-cancel"), false);
    timeline(result.transcript || (t.progress && t.progress.transcript));
    $("lookup-json").textContent = JSON.stringify(t, null, 2);
    $("lookup-message").textContent = "";
    show($("lookup-result"), true);
  }

  // An agent loop's turns and tool calls, one row each, in order (the result's transcript, or a running loop's).
  function timeline(transcript) {
    const turns = transcript && Array.isArray(transcript.turns) ? transcript.turns : [];
    const calls = transcript && Array.isArray(transcript.tool_calls) ? transcript.tool_calls : [];
    const rows = [];
    for (const turn of turns) {
      const u = turn.usage || {};
      const cost = typeof u.cost === "number" ? ` · ${u.cost.toFixed(6)} USD` : "";
      const asked = Array.isArray(turn.tool_calls) && turn.tool_calls.length ? turn.tool_calls.join(", ") : "final answer";
      rows.push(el("tr", { cls: "turn" }, el("td", { text: String(turn.turn) }), el("td", { text: turn.source ?? "" }),
        el("td", { text: `${u.input_tokens ?? 0} in / ${u.output_tokens ?? 0} out${cost}` }), el("td", { text: asked })));
      for (const c of calls.filter((x) => x.turn === turn.turn)) {
        rows.push(el("tr", { cls: c.error ? "call error" : "call" }, el("td"),
          el("td", {}, el("code", { text: `${c.name} (${c.id})` })),
          el("td", { text: `${c.attempts} attempt${c.attempts === 1 ? "" : "s"}` }), el("td", { text: c.error ? "error" : "ok" })));
      }
    }
    $("task-timeline-body").replaceChildren(...rows);
    show($("task-timeline"), rows.length > 0);
  }

  async function showJob(event) {
    if (event) event.preventDefault();
    const jobId = $("job-id").value.trim();
    if (!jobId) return;
    const r = await api("GET", "/jobs/" + encodeURIComponent(jobId));
    if (!r.ok || !r.data) return lookupFailed(`job ${jobId}`, r);
    const j = r.data;
    shownJob = jobId;
    show($("task-timeline"), false);
    $("lookup-title-text").textContent = "Job " + jobId;
    summary([
      ["state", j.state], ["created", when(j.created_at)], ["deadline", when(j.deadline)], ["finished", when(j.finished_at)],
      ["goal", j.goal], ["planner", j.planner], ["reason", j.reason],
      ["result", j.result && j.result.status ? j.result.status : ""],
    ]);
    const steps = j.steps && typeof j.steps === "object" ? j.steps : {};
    const order = Array.isArray(j.order) && j.order.length ? j.order : Object.keys(steps);
    $("job-steps-body").replaceChildren(...order.filter((id) => steps[id]).map((id) => {
      const s = steps[id];
      const taskCell = el("td");
      if (s.task_id) {
        taskCell.append(el("button", {
          cls: "secondary small", type: "button", text: String(s.task_id),
          on: { click: () => { $("task-id").value = String(s.task_id); showTask(); } },
        }));
      }
      return el("tr", {},
        el("td", {}, el("code", { text: id })), el("td", { text: s.agent ?? "" }), el("td", { text: s.status ?? "" }),
        taskCell, el("td", { text: clip(s.error ?? "", 200) }));
    }));
    show($("job-steps"), order.length > 0);
    const cancellable = j.state === "running" || j.state === "planning";
    show($("job-cancel"), cancellable);
    $("job-cancel-status").textContent = "";
    $("lookup-json").textContent = JSON.stringify(j, null, 2);
    $("lookup-message").textContent = "";
    show($("lookup-result"), true);
  }

  async function cancelJob(event) {
    event.preventDefault();
    const jobId = shownJob;
    if (!jobId) return;
    const status = $("job-cancel-status");
    const by = operator();
    const reason = $("job-cancel-reason").value.trim();
    if (!by || !reason) {
      status.className = "row-status error";
      status.textContent = by ? "Give a reason." : "Enter your operator name at the top first.";
      return;
    }
    const button = $("job-cancel-button");
    button.disabled = true;
    const r = await api("POST", "/jobs/" + encodeURIComponent(jobId) + "/cancel", { by, reason });
    button.disabled = false;
    if (r.ok) {
      status.className = "row-status ok";
      status.textContent = `Cancel sent by ${by}.`;
      notify("ok", `Cancel of job ${jobId} accepted (HTTP ${r.status}).`);
      setTimeout(() => { if (shownJob === jobId) showJob(); }, 1500);
      return;
    }
    status.className = "row-status " + (refused(r) ? "refused" : "error");
    status.textContent = reportFailure(r, `cancel job ${jobId}`);
  }

  // -- start -----------------------------------------------------------------------------------------------------------

  // What conversations.js (loaded after this file) shares: the text-only DOM helpers, the API call with the token,
  // how a failure is said, and the task look-up.
  window.AgentsStreamConsole = { el, show, clip, when, ago, token, api, problem, refused, stateBadge, openTask,
    TASK_STATE };

  function start() {
    const op = $("operator");
    op.value = stored(OPERATOR_KEY);
    op.addEventListener("input", () => store(OPERATOR_KEY, op.value.trim()));
    $("token-save").addEventListener("click", useToken);
    $("token-forget").addEventListener("click", forgetToken);
    $("token").addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); useToken(); } });
    $("notice-close").addEventListener("click", () => { $("notice").hidden = true; });
    $("approvals-refresh").addEventListener("click", refreshApprovals);
    $("dlq-form").addEventListener("submit", loadDeadLetters);
    $("dlq-older").addEventListener("click", olderDeadLetters);
    $("task-form").addEventListener("submit", showTask);
    $("job-form").addEventListener("submit", showJob);
    $("job-cancel").addEventListener("submit", cancelJob);
    renderTokenState();
    every(READY_EVERY_MS, pollReady);
    every(APPROVALS_EVERY_MS, refreshApprovals);
    every(BREAKERS_EVERY_MS, refreshBreakers);
    every(SAMPLES_EVERY_MS, refreshCharts);
    every(RECENT_EVERY_MS, refreshRecent);
    $("recent-state").addEventListener("change", drawRecent);
    $("charts-range").addEventListener("change", drawCharts);
    let resizing = null;
    window.addEventListener("resize", () => { clearTimeout(resizing); resizing = setTimeout(drawCharts, 150); });
  }

  start();
})();
