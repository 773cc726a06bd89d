// The console's dead letters: a page of them at a time (GET /dlq, filtered by agent, layer and reason, newest
// first), and a requeue per record (POST /dlq/requeue).
"use strict";

(() => {
  const C = window.AgentsStreamConsole;
  const { el, show, clip, api, problem, refused, reportFailure, notify, rowStatus } = C;
  const $ = (id) => document.getElementById(id);

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

  Object.assign(C, { loadDeadLetters, olderDeadLetters });
})();
