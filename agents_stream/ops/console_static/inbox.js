// The console's operators' inbox (GET /handoffs, every worker's): the conversations held by a person or waiting
// for one, the oldest first, with what the customer wrote since and, while nobody took it, the escalation level
// its wait reached and when that level is due; a person takes it, replies or hands the conversation back
// (POST /conversations/<id>/handoff, /reply, /handback, write token) signed with the operator's name at the top.
// Each action carries an action_id kept on its row, so a second click of the same send is the same action.
"use strict";

(() => {
  const C = window.AgentsStreamConsole;
  const { el, show, ago, when, api, problem, refused, reportFailure, notify, operator, rowStatus, every } = C;
  const $ = (id) => document.getElementById(id);
  const INBOX_EVERY_MS = 5000;
  const rows = new Map(); // conversation_id -> <tr>, kept across polls so a half-typed reply survives a refresh

  function openConversation(id) {
    $("conv-id").value = id;
    $("conv-form").requestSubmit();
  }

  function inboxRow(id) {
    const text = el("input", { cls: "comment", type: "text", attrs: { placeholder: "reply, or a note for the agent", maxlength: "16000", autocomplete: "off" } });
    const take = el("button", { cls: "take", type: "button", text: "Take", on: { click: () => act(row, id, "handoff") } });
    const reply = el("button", { cls: "approve", type: "button", text: "Reply", on: { click: () => act(row, id, "reply") } });
    const back = el("button", { cls: "handback", type: "button", text: "Hand back", on: { click: () => act(row, id, "handback") } });
    const row = el("tr", { data: { inboxConversation: id } },
      el("td", {}, el("button", { cls: "link-button", type: "button", title: "open this conversation",
        on: { click: () => openConversation(id) } }, el("code", { text: id })), el("div", { cls: "agent muted small" })),
      el("td", { cls: "held" }),
      el("td", { cls: "level" }),
      el("td", { cls: "waiting-messages small" }),
      el("td", { cls: "waiting" }),
      el("td", {}, el("div", { cls: "decision" }, text, take, reply, back, el("span", { cls: "row-status" }))),
    );
    return row;
  }

  function updateRow(row, c) {
    const cell = (cls) => row.querySelector("td." + cls);
    row.querySelector(".agent").textContent = String(c.agent ?? "");
    cell("held").textContent = `${c.held_by ?? "waiting for a person"} · ${c.source ?? ""}: ${c.reason ?? ""}`;
    // the escalation level of its wait (tables/handoff_wait.py): due while nobody took it; past the last, unanswered
    const level = typeof c.level === "number" ? `${c.level}${c.level_name ? " · " + c.level_name : ""}` : "–";
    const due = c.unanswered ? " · every level's time ran out" : (typeof c.due === "number" ? " · due " + when(c.due) : "");
    cell("level").textContent = level + due;
    cell("level").title = (Array.isArray(c.escalations) ? c.escalations : [])
      .map((e) => `level ${Number(e.from) + 1} → ${e.to === null ? "none left" : Number(e.to) + 1} at ${when(e.at)}`).join("\n");
    row.querySelector("button.take").hidden = c.held_by !== null && c.held_by !== undefined;    const waiting = Array.isArray(c.waiting) ? c.waiting : [];
    cell("waiting-messages").textContent = waiting.map((m) => String(m.text ?? "")).join(" · ");
    cell("waiting").textContent = typeof c.held_at === "number" ? ago(c.held_at) : "";
  }

  async function act(row, id, action) {
    const by = operator();
    if (!by) {
      rowStatus(row, "error", "Enter your operator name at the top first.");
      $("operator").focus();
      return;
    }
    const input = row.querySelector("input.comment");
    const text = input.value.trim();
    if (action === "reply" && !text) {
      rowStatus(row, "error", "Write the reply first.");
      return;
    }
    const key = `${action}:${text}`; // the same send clicked again keeps its action_id: it counts once
    if (row.dataset.sent !== key) {
      row.dataset.sent = key;
      row.dataset.actionId = `console-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 10)}`;
    }
    const r = await api("POST", `/conversations/${encodeURIComponent(id)}/${action}`,
      { by, text, action_id: row.dataset.actionId });
    if (r.ok) {
      input.value = "";
      const done = { handoff: "Take", reply: "Reply", handback: "Hand back" }[action];
      rowStatus(row, "ok", `${done} by ${by} accepted; the ledger applies it in a moment.`);
      notify("ok", `${action} of ${id} accepted (HTTP ${r.status}).`);
      setTimeout(refreshInbox, 1500);
      return;
    }
    rowStatus(row, refused(r) ? "refused" : "error", reportFailure(r, `${action} ${id}`));
  }

  async function refreshInbox() {
    const r = await api("GET", "/handoffs");
    const error = $("inbox-error");
    if (!r.ok || !r.data || !Array.isArray(r.data.conversations)) {
      error.textContent = "Could not load the inbox: " + problem(r);
      show(error, true);
      return;
    }
    const unreachable = Array.isArray(r.data.unreachable) ? r.data.unreachable.map(String) : [];
    error.textContent = unreachable.length ? "Not answering, their conversations are missing: " + unreachable.join(", ") : "";
    show(error, unreachable.length > 0);
    const listed = r.data.conversations;
    const seen = new Set();
    for (const c of listed) {
      const id = String(c.conversation_id);
      seen.add(id);
      if (!rows.has(id)) rows.set(id, inboxRow(id));
      updateRow(rows.get(id), c);
    }
    for (const id of [...rows.keys()]) if (!seen.has(id)) rows.delete(id);
    $("inbox-body").replaceChildren(...listed.map((c) => rows.get(String(c.conversation_id))));
    $("inbox-count").textContent = String(listed.length);
    show($("inbox-table"), listed.length > 0);
    show($("inbox-empty"), listed.length === 0);
  }

  every(INBOX_EVERY_MS, refreshInbox);
})();
