// The console's desk (GET /desk/<agent>, every worker's): a desk's open conversations, the longest waiting first,
// the handler each last went to and how long its oldest unanswered message has waited; a row opens the
// conversation in the conversation view (conversations.js).
"use strict";

(() => {
  const C = window.AgentsStreamConsole;
  const { el, show, ago, api, problem, stateBadge, every } = C;
  const $ = (id) => document.getElementById(id);
  const DESK_EVERY_MS = 5000;
  const DESK_STATE = { answering: "info", waiting_for_approval: "warn", idle: "ok" };
  let agent = null;

  function seconds(s) {
    if (typeof s !== "number") return "";
    return ago(Date.now() / 1000 - s);
  }

  function openConversation(id) {
    $("conv-id").value = id;
    $("conv-form").requestSubmit();
  }

  function deskRow(c) {
    const id = String(c.conversation_id);
    const routes = (Array.isArray(c.routes) ? c.routes : []).map((r) =>
      `${r.round}: ${r.first === r.handler ? r.handler : `${r.first} → ${r.handler}`} (${r.by})`).join(" · ");
    return el("tr", { data: { deskConversation: id, state: String(c.status ?? "") } },
      el("td", {}, el("button", { cls: "link-button", type: "button", title: "open this conversation",
        on: { click: () => openConversation(id) } }, el("code", { text: id }))),
      el("td", {}, stateBadge(c.status, DESK_STATE)),
      el("td", { text: c.handler ?? "" }),
      el("td", { cls: "small", text: routes }),
      el("td", { cls: "num", text: c.waiting ? `${c.waiting} · ${seconds(c.waiting_s)}` : "" }),
    );
  }

  async function refreshDesk() {
    if (!agent) return;
    const r = await api("GET", "/desk/" + encodeURIComponent(agent));
    const error = $("desk-error");
    if (!r.ok || !r.data || !Array.isArray(r.data.conversations)) {
      error.textContent = `Desk ${agent}: ${problem(r)}`;
      show(error, true);
      return;
    }
    const unreachable = Array.isArray(r.data.unreachable) ? r.data.unreachable.map(String) : [];
    error.textContent = unreachable.length ? "Not answering, their conversations are missing: " + unreachable.join(", ") : "";
    show(error, unreachable.length > 0);
    const rows = r.data.conversations;
    $("desk-body").replaceChildren(...rows.map(deskRow));
    $("desk-count").textContent = String(rows.length);
    show($("desk-table"), rows.length > 0);
    show($("desk-empty"), rows.length === 0);
  }

  $("desk-form").addEventListener("submit", (event) => {
    event.preventDefault();
    agent = $("desk-agent").value.trim() || null;
    refreshDesk();
  });
  every(DESK_EVERY_MS, refreshDesk);
})();
