// The console's conversation view: a conversation's messages and replies, each round's tool calls, live.
//
// Three sources fold into one model, each idempotently (the same message, call or reply from two of them is one):
// the history (GET /conversations/<id>, a page of messages and replies), each round's transcript (GET /tasks/<round
// task id>: its tool calls, their status and attempts) and the event stream (GET /conversations/<id>/events: turns
// with their arguments, tool results, replies, as they happen). The stream is read with fetch, not EventSource:
// EventSource cannot send the Authorization header, and the token never goes in a URL. It resumes as EventSource
// would, with Last-Event-ID (the event's offset in agent.conversation.events), after every cut.
//
// Every text (a message, a reply, a tool's arguments and output) is untrusted: it reaches the page through
// textContent only (common.js's el()).
"use strict";

(() => {
  const C = window.AgentsStreamConsole;
  const { el, show, clip, when, ago } = C;
  const $ = (id) => document.getElementById(id);
  const ROUND_PREFIX = "conv:";
  const TRANSCRIPT_ROUNDS = 20; // rounds of the shown page whose transcripts are read (one GET /tasks each)
  const RETRY_MS = 2000;
  const REFUSED_RETRY_MS = 5000;
  const ARGS_CHARS = 120;
  const RECENT_SHOWN = 12;

  // History items carry epoch seconds, events an ISO time.
  const seconds = (at) => (typeof at === "string" ? Date.parse(at) / 1000 : at);

  let conv = null; // the conversation shown (model below); null when none

  function fresh(id) {
    return {
      id, status: "", agent: "", next: null, from: null, seq: 0, lastEventId: null, ctl: new AbortController(),
      messages: new Map(), // message_id -> {id, text, user, at, round, seq}
      replies: new Map(), // "<round>:<message ids>" -> {round, text, status, error, task_id, message_ids, at, seq}
      rounds: new Map(), // round -> {task_id, calls: Map(call_id -> call), notes: [], attempt}
    };
  }

  function round(n) {
    let r = conv.rounds.get(n);
    if (!r) {
      r = { task_id: null, calls: new Map(), notes: [], attempt: 1 };
      conv.rounds.set(n, r);
    }
    return r;
  }

  // -- folding the sources in -----------------------------------------------------------------------------------------

  function addMessage(m, seq) {
    const known = conv.messages.get(m.id);
    if (known) {
      if (typeof m.round === "number") known.round = m.round;
      return;
    }
    conv.messages.set(m.id, { id: m.id, text: String(m.text ?? ""), user: m.user ?? null, at: m.at ?? null,
      round: typeof m.round === "number" ? m.round : null, seq });
  }

  function addReply(r, seq) {
    const ids = Array.isArray(r.message_ids) ? r.message_ids.map(String) : [];
    const key = `${r.round}:${ids.join(",")}`;
    if (!conv.replies.has(key)) {
      conv.replies.set(key, { round: r.round, text: String(r.text ?? ""), status: String(r.status ?? ""),
        error: r.error ?? null, task_id: r.task_id ?? null, message_ids: ids, at: r.at ?? r.completed_at ?? null, seq });
    }
    if (typeof r.round === "number" && r.task_id) round(r.round).task_id = String(r.task_id);
  }

  function addCall(n, id, fields) {
    const calls = round(n).calls;
    const known = calls.get(id) || { id, turn: null, name: "", args: undefined, status: "running", attempts: null,
      content: "" };
    for (const [k, v] of Object.entries(fields)) if (v !== undefined && v !== null) known[k] = v;
    calls.set(id, known);
  }

  function addHistory(body) {
    conv.status = String(body.status ?? "");
    conv.agent = String(body.agent ?? "");
    conv.next = typeof body.next === "number" ? body.next : null;
    // The stream starts at the conversation's first event: the rounds before this page stay off the view until
    // "Earlier history" asks for them (a long conversation is not drawn whole).
    const numbers = (Array.isArray(body.history) ? body.history : []).map((i) => i.round).filter(Number.isInteger);
    conv.from = conv.next === null ? null : Math.min(...numbers, conv.from ?? Infinity);
    for (const item of Array.isArray(body.history) ? body.history : []) {
      if (item.role === "customer") addMessage(item, item.i);
      else addReply(item, item.i);
    }
    for (const m of Array.isArray(body.waiting) ? body.waiting : []) addMessage(m, Number.MAX_SAFE_INTEGER / 2);
    if (body.round && typeof body.round.round === "number") round(body.round.round).task_id = String(body.round.task_id);
  }

  function addTranscript(n, transcript) {
    for (const c of transcript && Array.isArray(transcript.tool_calls) ? transcript.tool_calls : []) {
      addCall(n, String(c.id), { turn: c.turn, name: c.name, status: c.error ? "error" : "ok", attempts: c.attempts });
    }
  }

  function before(n) { return Number.isInteger(n) && conv.from !== null && n < conv.from; }

  function apply(event) {
    const n = event.round;
    const d = event.data || {};
    if (before(n)) { // an earlier round's: its messages, met before their round was named, leave the view too
      for (const id of [...(d.message_ids || []), d.message_id]) {
        const m = conv.messages.get(String(id));
        if (m && m.seq >= 1e12) conv.messages.delete(String(id));
      }
      return;
    }
    const seq = 1e12 + ++conv.seq; // after every history item, in the stream's order
    switch (event.kind) {
      case "message": addMessage({ id: String(d.message_id), text: d.text, user: d.user, at: event.at }, seq); break;
      case "round_started":
        for (const id of d.message_ids || []) addMessage({ id: String(id), round: n }, seq);
        round(n);
        conv.status = "answering";
        break;
      case "message_joined": addMessage({ id: String(d.message_id), round: n }, seq); break;
      case "dispatched": round(n).attempt = d.attempt; break;
      case "turn":
        (d.tool_calls || []).forEach((c, index) => addCall(n, String(c.id), { turn: d.turn, index, name: c.name,
          args: c.arguments }));
        break;
      case "tool_result":
        addCall(n, String(d.call_id), { turn: d.turn, name: d.name, status: d.error ? "error" : "ok",
          content: String(d.content ?? "") });
        break;
      case "waiting_for_approval": round(n).notes.push("waiting for a person to approve a call"); conv.status = "waiting_for_approval"; break;
      case "decision": addCall(n, String(d.call_id), { decision: `${d.decision} by ${d.by}` }); conv.status = "answering"; break;
      case "waiting_for_subagents": round(n).notes.push("waiting for sub-agents"); conv.status = "waiting_for_subagents"; break;
      case "subagent_result": round(n).notes.push(`sub-agent ${d.agent}: ${d.status}`); break;
      case "routed": round(n).notes.push(`routed to ${d.handler} (${d.by}: ${d.reason})`); break;
      case "escalated": round(n).notes.push(`escalated from ${d.from} to ${d.to}: ${d.reason}`); break;
      case "reply":
        addReply({ ...d, at: event.at }, seq);
        if (d.status !== "rejected") conv.status = "idle"; // a refused message leaves the open round answering
        break;
      case "deleted": // begun again under its id: what was shown belongs to the deleted conversation
        for (const part of [conv.messages, conv.replies, conv.rounds]) part.clear();
        conv.status = "deleted";
        conv.next = null;
        break;
      default: break;
    }
    draw();
  }

  // -- drawing ----------------------------------------------------------------------------------------------------------

  let drawing = null;

  function draw() { // many events arrive together (a resume, a busy round): one redraw for them
    if (drawing === null) drawing = setTimeout(() => { drawing = null; render(); }, 30);
  }

  const STATUS = { idle: "ok", answering: "info", waiting_for_approval: "warn", waiting_for_subagents: "warn",
    deleted: "bad" };

  function messageItem(m) {
    return el("li", { cls: "msg customer" + (m.round === null ? " waiting" : ""), data: { messageId: m.id } },
      el("div", { cls: "who muted small", text: `${m.user || "customer"} · ${m.id}${m.at ? " · " + ago(seconds(m.at)) + " ago" : ""}`,
        title: m.at ? when(seconds(m.at)) : "" }),
      el("div", { cls: "text", text: m.text }),
      m.round === null ? el("div", { cls: "muted small", text: "waiting for a round" }) : null);
  }

  function replyItem(r) {
    const failed = r.status && r.status !== "succeeded";
    return el("li", { cls: "msg agent" + (failed ? " failed" : ""), data: { round: r.round, status: r.status } },
      el("div", { cls: "who muted small", text: `${conv.agent || "agent"} · round ${r.round}${failed ? " · " + r.status : ""}`,
        title: r.at ? when(seconds(r.at)) : "" }),
      el("div", { cls: "text", text: r.text }),
      r.error ? el("div", { cls: "error small", text: clip(String(r.error), 300) }) : null);
  }

  function callItem(c) {
    const args = c.args === undefined ? "" : clip(JSON.stringify(c.args), ARGS_CHARS);
    const attempts = typeof c.attempts === "number" ? ` · ${c.attempts} attempt${c.attempts === 1 ? "" : "s"}` : "";
    return el("li", { cls: "call " + c.status, data: { callId: c.id, status: c.status } },
      el("code", { cls: "name", text: c.name || "?" }),
      el("code", { cls: "args muted", text: args ? `(${args})` : "", title: c.args === undefined ? "" : clip(JSON.stringify(c.args), 2000) }),
      el("span", { cls: "badge " + (c.status === "ok" ? "ok" : c.status === "error" ? "bad" : "info"), text: c.status }),
      el("span", { cls: "muted small", text: `${c.turn !== null ? "turn " + c.turn : ""}${attempts}${c.decision ? " · " + c.decision : ""}` }),
      c.content ? el("div", { cls: "output muted small", text: clip(c.content, 200), title: clip(c.content, 2000) }) : null);
  }

  function roundItem(n, r) {
    // In the order the model asked for them: by turn, then their place in the turn (known from its event).
    const place = (c) => [c.turn ?? 0, c.index ?? Infinity];
    const calls = [...r.calls.values()].sort((a, b) => place(a)[0] - place(b)[0] || place(a)[1] - place(b)[1]
      || (a.id < b.id ? -1 : 1));
    const task = r.task_id
      ? el("button", { cls: "link-button", type: "button", title: "show the round's task (its record and transcript)",
        on: { click: () => C.openTask(r.task_id) } }, el("code", { text: r.task_id }))
      : null;
    return el("li", { cls: "round", data: { round: n } },
      el("div", { cls: "muted small" }, `round ${n}${r.attempt > 1 ? ` · attempt ${r.attempt} (taken over)` : ""} · `, task),
      calls.length ? el("ol", { cls: "calls" }, ...calls.map(callItem)) : el("div", { cls: "muted small", text: "no tool calls" }),
      ...r.notes.slice(-3).map((note) => el("div", { cls: "muted small", text: note })));
  }

  function render() {
    if (!conv) return;
    $("conv-title").textContent = "Conversation " + conv.id;
    const status = $("conv-status");
    status.textContent = (conv.status || "unknown").replaceAll("_", " ");
    status.className = "badge " + (STATUS[conv.status] ?? "");
    const bySeq = (a, b) => a.seq - b.seq;
    const messages = [...conv.messages.values()].sort(bySeq);
    const replies = [...conv.replies.values()].sort(bySeq);
    const numbers = new Set([...messages, ...replies].map((x) => x.round).filter((n) => typeof n === "number"));
    for (const n of conv.rounds.keys()) numbers.add(n);
    const items = [];
    for (const n of [...numbers].sort((a, b) => a - b)) {
      items.push(...messages.filter((m) => m.round === n).map(messageItem));
      if (conv.rounds.has(n)) items.push(roundItem(n, conv.rounds.get(n)));
      items.push(...replies.filter((r) => r.round === n).map(replyItem));
    }
    items.push(...messages.filter((m) => m.round === null).map(messageItem));
    $("conv-thread").replaceChildren(...items);
    show($("conv-older"), conv.next !== null);
    $("conv-view").dataset.lastEventId = conv.lastEventId === null ? "" : String(conv.lastEventId);
  }

  function live(kind, text, title) {
    const badge = $("conv-live");
    badge.textContent = text;
    badge.className = "badge " + kind;
    badge.title = title || "";
  }

  // -- reading ------------------------------------------------------------------------------------------------------------

  const path = (id) => "/conversations/" + encodeURIComponent(id);

  async function open(event) {
    if (event) event.preventDefault();
    const id = $("conv-id").value.trim();
    if (!id) return;
    if (conv) conv.ctl.abort();
    conv = fresh(id);
    const mine = conv;
    const message = $("conv-message");
    message.className = "muted";
    message.textContent = "Loading…";
    const r = await C.api("GET", path(id));
    if (conv !== mine) return;
    if (r.status === 404) {
      message.textContent = "No message of this conversation is recorded yet; its events are followed as they come.";
    } else if (!r.ok || !r.data) {
      message.className = "error";
      message.textContent = `Conversation ${id}: ${C.problem(r)}`;
      conv = null;
      show($("conv-view"), false);
      return;
    } else {
      message.textContent = "";
      addHistory(r.data);
    }
    render();
    show($("conv-view"), true);
    follow(mine);
    await transcripts(mine);
  }

  async function older() {
    const mine = conv;
    if (!mine || mine.next === null) return;
    const r = await C.api("GET", `${path(mine.id)}?before=${mine.next}`);
    if (conv !== mine) return;
    if (!r.ok || !r.data) { $("conv-message").textContent = "Earlier history: " + C.problem(r); return; }
    addHistory({ ...r.data, status: mine.status, round: null, waiting: [] });
    render();
    await transcripts(mine);
  }

  // Each round's tool calls as its transcript says (a finished round's result, a running one's progress). The
  // stream brings the same calls with their arguments while its events are retained; this covers older rounds.
  async function transcripts(mine) {
    const wanted = [...mine.rounds.entries()].filter(([, r]) => r.task_id && !r.transcribed)
      .sort((a, b) => b[0] - a[0]).slice(0, TRANSCRIPT_ROUNDS);
    await Promise.all(wanted.map(async ([n, r]) => {
      r.transcribed = true;
      const t = await C.api("GET", "/tasks/" + encodeURIComponent(r.task_id));
      if (conv !== mine || !t.ok || !t.data) return;
      addTranscript(n, (t.data.result && t.data.result.transcript) || (t.data.progress && t.data.progress.transcript));
    }));
    if (conv === mine) render();
  }

  // The event stream, read as text/event-stream; every cut (the worker's 10-minute end, a kill, the network)
  // reconnects with Last-Event-ID, so the stream goes on after the last event shown.
  async function follow(mine) {
    while (!mine.ctl.signal.aborted) {
      const headers = { Accept: "text/event-stream" };
      if (C.token()) headers.Authorization = "Bearer " + C.token();
      if (mine.lastEventId !== null) headers["Last-Event-ID"] = String(mine.lastEventId);
      let wait = RETRY_MS;
      try {
        const resp = await fetch(path(mine.id) + "/events", { headers, cache: "no-store", credentials: "same-origin",
          referrerPolicy: "no-referrer", signal: mine.ctl.signal });
        if (!resp.ok || !resp.body) {
          const text = await resp.text();
          const r = { ok: false, status: resp.status, data: null, text };
          try { r.data = JSON.parse(text); } catch (e) { /* not JSON: said as text */ }
          live(C.refused(r) ? "bad" : "warn", C.refused(r) ? "refused" : `HTTP ${resp.status}`, C.problem(r));
          if (C.refused(r)) wait = REFUSED_RETRY_MS;
        } else {
          live("ok", "live", "following the conversation's events");
          await read(mine, resp.body);
          if (!mine.ctl.signal.aborted) live("warn", "reconnecting", "the stream ended; resuming after the last event");
        }
      } catch (e) {
        if (mine.ctl.signal.aborted) return;
        live("warn", "reconnecting", String((e && e.message) || e));
      }
      await new Promise((resolve) => setTimeout(resolve, wait));
    }
  }

  async function read(mine, body) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let fields = { id: null, event: "", data: [] };
    for (;;) {
      const { value, done } = await reader.read();
      if (done || mine.ctl.signal.aborted) return;
      buffer += value;
      const lines = buffer.split(/\r\n|\r|\n/);
      buffer = lines.pop();
      for (const line of lines) {
        if (line === "") { // the end of one event
          if (fields.data.length) received(mine, fields);
          fields = { id: null, event: "", data: [] };
        } else if (!line.startsWith(":")) { // a ": keepalive" comment is not an event
          const at = line.indexOf(":");
          const name = at < 0 ? line : line.slice(0, at);
          const text = at < 0 ? "" : line.slice(at + 1).replace(/^ /, "");
          if (name === "data") fields.data.push(text);
          else if (name === "id" || name === "event") fields[name] = text;
        }
      }
    }
  }

  function received(mine, fields) {
    if (conv !== mine) return;
    let data = null;
    try { data = JSON.parse(fields.data.join("\n")); } catch (e) { return; }
    if (fields.event === "error") { // the worker's consumer failed: the stream ends next and resumes
      live("warn", "reconnecting", String(data && data.error));
      return;
    }
    if (fields.id !== null && /^\d+$/.test(fields.id)) mine.lastEventId = Number(fields.id);
    // A round seen first in the stream has its calls, their arguments and status from the stream alone: no
    // transcript is read for it (a resume from the first event would read one per round of the conversation).
    if (data && typeof data === "object") apply(data);
  }

  // -- the conversations among the recent tasks ---------------------------------------------------------------------

  // A round's task id is conv:<conversation id>@<since>#<round>[.<k>] (contract/conversation_messages.round_task_id).
  function conversationOf(taskId) {
    if (!taskId.startsWith(ROUND_PREFIX)) return null;
    const hash = taskId.lastIndexOf("#");
    const at = taskId.lastIndexOf("@", hash);
    if (hash < 0 || at < ROUND_PREFIX.length) return null;
    return { id: taskId.slice(ROUND_PREFIX.length, at), round: parseInt(taskId.slice(hash + 1), 10) };
  }

  function recent(event) {
    const tasks = event.detail && Array.isArray(event.detail.tasks) ? event.detail.tasks : [];
    const seen = new Map(); // newest change first: a conversation's first row is its latest round
    for (const t of tasks) {
      const c = conversationOf(String(t.task_id));
      if (c && !seen.has(c.id)) seen.set(c.id, { ...c, state: t.held ? "held" : String(t.state), at: t.at, agent: t.agent });
    }
    const shown = [...seen.values()].slice(0, RECENT_SHOWN);
    $("conv-recent").replaceChildren(...shown.map((c) => el("button", {
      cls: "link-button", type: "button", data: { conversation: c.id, state: c.state },
      title: `${c.agent ?? ""} · round ${c.round} · ${ago(c.at)} ago`,
      on: { click: () => { $("conv-id").value = c.id; open(); } },
    }, el("code", { text: c.id }), " ", C.stateBadge(c.state, C.TASK_STATE))));
    show($("conv-recent-empty"), shown.length === 0);
  }

  function close() {
    if (conv) conv.ctl.abort();
    conv = null;
    show($("conv-view"), false);
    $("conv-message").textContent = "";
  }

  $("conv-form").addEventListener("submit", open);
  $("conv-close").addEventListener("click", close);
  $("conv-older").addEventListener("click", older);
  document.addEventListener("agents-stream:recent", recent);
  // A token typed after a refusal: the stream asks again now rather than at its next retry.
  document.addEventListener("agents-stream:token", () => { if (conv) { $("conv-id").value = conv.id; open(); } });
})();
