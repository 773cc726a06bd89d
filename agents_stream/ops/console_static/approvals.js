// The console's approvals inbox: the tasks parked for a human decision (GET /approvals, every worker's), and the
// decision, signed with the operator's name (POST /approvals/<task id>).
"use strict";

(() => {
  const C = window.AgentsStreamConsole;
  const { el, show, clip, when, ago, api, problem, refused, reportFailure, notify, operator, rowStatus } = C;
  const $ = (id) => document.getElementById(id);
  const RETRY_DECIDED_AFTER_MS = 20000; // a decision sent but still parked after this: offer the buttons again

  const approvalRows = new Map(); // task_id -> <tr>, kept across polls so a half-typed comment survives a refresh

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

  Object.assign(C, { refreshApprovals });
})();
