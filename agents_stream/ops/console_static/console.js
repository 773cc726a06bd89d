// The operator console's start: the token and operator fields, then every view's handlers and polls. Plain JS, no
// build step, no dependencies; the views are the scripts index.html loads before this one (common.js first).
"use strict";

(() => {
  const C = window.AgentsStreamConsole;
  const { OPERATOR_KEY, TOKEN_KEY, stored, store, token, notify, every } = C;
  const { refreshApprovals, refreshBreakers, refreshCharts, refreshRecent, drawRecent, drawCharts, pollReady } = C;
  const { loadDeadLetters, olderDeadLetters, showTask, showJob, cancelJob } = C;
  const $ = (id) => document.getElementById(id);
  const READY_EVERY_MS = 3000;
  const APPROVALS_EVERY_MS = 4000;
  const BREAKERS_EVERY_MS = 5000;
  const SAMPLES_EVERY_MS = 3000;
  const RECENT_EVERY_MS = 4000;

  // -- token and operator ------------------------------------------------------------------------------------------

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

  // -- start -----------------------------------------------------------------------------------------------------------

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
