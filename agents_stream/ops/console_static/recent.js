// The console's recent tasks and jobs (GET /recent, every worker's), newest change first, filtered by state; a
// task or job opens in the look-up (lookup.js).
"use strict";

(() => {
  const C = window.AgentsStreamConsole;
  const { el, show, when, ago, number, api, problem, stateBadge, TASK_STATE, openTask, openJob } = C;
  const $ = (id) => document.getElementById(id);
  const RECENT_LIMIT = 50;
  const JOB_STATE = { planning: "info", running: "info", succeeded: "ok", partial: "warn", failed: "bad" };
  const ACTIVE = new Set(["running", "held", "awaiting_approval", "awaiting_subtasks"]);
  const PROBLEM = new Set(["failed", "dead_lettered", "rejected", "cancelled"]);
  let lastRecent = null;

  function shortWorker(w) {
    const parts = String(w ?? "").split(":");
    return parts[parts.length - 1];
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

  Object.assign(C, { drawRecent, refreshRecent });
})();
