// The console's look-up: a task (its record, result and an agent loop's transcript, turn by turn) or a job (its
// steps), and a job's cancel. Other views open a task or a job here (openTask, openJob).
"use strict";

(() => {
  const C = window.AgentsStreamConsole;
  const { el, show, clip, when, api, problem, refused, reportFailure, notify, operator } = C;
  const $ = (id) => document.getElementById(id);

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
    const route = transcript && transcript.route && typeof transcript.route === "object" ? transcript.route : null;
    if (route) { // a routed agent's task: the handler its route chose (and why, at what cost), then each escalation
      const u = route.usage || {};
      const cost = typeof u.cost === "number" ? ` · ${u.cost.toFixed(6)} USD` : "";
      rows.push(el("tr", { cls: "turn" }, el("td", { text: "route" }), el("td", { text: route.source ?? route.by ?? "" }),
        el("td", { text: route.source ? `${u.input_tokens ?? 0} in / ${u.output_tokens ?? 0} out${cost}` : "" }),
        el("td", { text: `→ ${route.first} (${route.by}: ${route.reason})` })));
      for (const e of Array.isArray(route.escalations) ? route.escalations : []) {
        rows.push(el("tr", { cls: "call error" }, el("td"), el("td", { text: "escalated" }), el("td"),
          el("td", { text: `${e.from} → ${e.to}: ${e.reason}` })));
      }
    }
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

  function openTask(taskId) {
    $("task-id").value = taskId;
    showTask().then(() => $("lookup").scrollIntoView({ block: "start" }));
  }

  function openJob(jobId) {
    $("job-id").value = jobId;
    showJob().then(() => $("lookup").scrollIntoView({ block: "start" }));
  }

  Object.assign(C, { showTask, showJob, cancelJob, openTask, openJob });
})();
