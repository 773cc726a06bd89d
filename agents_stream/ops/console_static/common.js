// The operator console's shared parts: the text-only DOM helpers, the token and operator name, notices, the API
// call, how a failure is said, polling. Plain JS, no build step, no dependencies.
//
// Everything the API returns (task ids, reasons, instructions, outputs) is untrusted: it reaches the page only
// through textContent / text nodes, never innerHTML. The API token lives in sessionStorage (this tab only, gone
// when it closes), is sent only as an Authorization header, and never appears in a URL.
//
// Loaded first: it makes window.AgentsStreamConsole, the one object the console's scripts share. Each later script
// (lookup.js, recent.js, live.js, approvals.js, deadletters.js, console.js, conversations.js, in index.html's order)
// takes what it uses from it and adds what it offers.
"use strict";

(() => {
  const TOKEN_KEY = "agents-stream.token";
  const OPERATOR_KEY = "agents-stream.operator";
  const TIMEOUT_MS = 10000;

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

  // -- shared by the views --------------------------------------------------------------------------------------------

  function rowStatus(row, kind, message) {
    const status = row.querySelector(".row-status");
    status.textContent = message;
    status.className = "row-status " + kind;
  }

  const TASK_STATE = {
    succeeded: "ok", running: "info", held: "bad", awaiting_approval: "warn", awaiting_subtasks: "warn",
    failed: "bad", dead_lettered: "bad", rejected: "bad", cancelled: "",
  };

  function stateBadge(state, classes) {
    const s = String(state ?? "unknown");
    return el("span", { cls: "badge " + (classes[s] ?? ""), text: s.replace("_", " "), data: { state: s } });
  }

  window.AgentsStreamConsole = { OPERATOR_KEY, TOKEN_KEY, el, show, clip, when, ago, number, stored, store, token,
    operator, notify, api, refused, problem, reportFailure, every, rowStatus, TASK_STATE, stateBadge };
})();
