// The console's charts: SVG drawn from GET /samples, plain JS, no build step, no dependencies.
//
// Exposes window.AgentsStreamCharts = { line, breakers }. Each draws into a <figure class="chart"> whose
// .plot element receives the SVG, its .now element the latest value, and whose dataset says what was drawn
// (points, max, last; for breakers cells and open) so a test or a curious operator can read it back.
// Names from the API (providers, tools) reach the page only as text nodes and attribute values.
"use strict";

(() => {
  const NS = "http://www.w3.org/2000/svg";
  const HEIGHT = 120;
  const PAD = { left: 40, right: 8, top: 8, bottom: 20 };
  const ROW_MIN = 18; // one breaker per row: tall bands for a few breakers, thin ones for many
  const ROW_MAX = 34;
  const LABEL = 128; // room for a breaker's name

  function node(tag, attrs, text) {
    const n = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, String(v));
    if (text !== undefined) n.textContent = String(text);
    return n;
  }

  const finite = (v) => typeof v === "number" && Number.isFinite(v);

  // 0.7 → 1, 3 → 5, 12 → 20, 180 → 200: gridlines at round numbers.
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = 10 ** Math.floor(Math.log10(v));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v - 1e-9) return m * p;
    return 10 * p;
  }

  function fmt(v, digits) {
    if (!finite(v)) return "–";
    if (digits && Math.abs(v) < 100) return v.toFixed(digits);
    return String(Math.round(v));
  }

  function clock(t) {
    return new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  }

  function minutes(span) {
    return span >= 120 ? `−${Math.round(span / 60)} min` : `−${Math.round(span)} s`;
  }

  // The frame both kinds share: an SVG as wide as its box, the time axis from t[0] to the last t.
  function frame(fig, t, height, left) {
    const plot = fig.querySelector(".plot");
    const width = Math.max(220, Math.floor(plot.clientWidth || 0));
    const svg = node("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" });
    const t0 = t[0];
    const t1 = t[t.length - 1];
    const inner = width - left - PAD.right;
    const x = (ti) => left + (t1 > t0 ? ((ti - t0) / (t1 - t0)) * inner : inner);
    const base = height - PAD.bottom;
    for (const [at, label, anchor] of [[t0, minutes(t1 - t0), "start"], [(t0 + t1) / 2, minutes((t1 - t0) / 2), "middle"], [t1, "now", "end"]]) {
      svg.append(node("text", { x: x(at), y: height - 5, class: "axis", "text-anchor": anchor }, label));
    }
    svg.append(node("line", { x1: left, x2: left + inner, y1: base, y2: base, class: "base" }));
    return { plot, svg, width, x, base, t0, t1 };
  }

  // The value under the pointer, shown in the caption: the nearest grid time that has one.
  function hover(fig, f, t, values, describe) {
    const guide = node("line", { y1: PAD.top, y2: f.base, class: "guide", visibility: "hidden" });
    f.svg.append(guide);
    const caption = fig.querySelector(".at");
    f.svg.addEventListener("mousemove", (e) => {
      const box = f.svg.getBoundingClientRect();
      const px = e.clientX - box.left;
      let best = -1;
      for (let i = 0; i < t.length; i++) {
        if (values[i] === null || values[i] === undefined) continue;
        if (best < 0 || Math.abs(f.x(t[i]) - px) < Math.abs(f.x(t[best]) - px)) best = i;
      }
      if (best < 0) return;
      guide.setAttribute("x1", f.x(t[best]));
      guide.setAttribute("x2", f.x(t[best]));
      guide.setAttribute("visibility", "visible");
      if (caption) caption.textContent = `${clock(t[best])}: ${describe(values[best])}`;
    });
    f.svg.addEventListener("mouseleave", () => {
      guide.setAttribute("visibility", "hidden");
      if (caption) caption.textContent = "";
    });
  }

  // A line over time; null values are gaps. opts: { digits, unit }.
  function line(fig, t, values, opts) {
    const o = opts || {};
    const f = frame(fig, t, HEIGHT, PAD.left);
    const known = values.filter(finite);
    const top = niceMax(Math.max(0, ...known));
    const y = (v) => PAD.top + (1 - v / top) * (f.base - PAD.top);
    for (const g of [top / 2, top]) {
      f.svg.append(node("line", { x1: PAD.left, x2: f.width - PAD.right, y1: y(g), y2: y(g), class: "grid" }));
    }
    for (const g of [0, top / 2, top]) {
      // 0.25 stays 0.25, 2.5 stays 2.5, 20 is 20: the labels of niceMax's gridlines, exactly
      const label = g >= 10 ? String(Math.round(g)) : String(Number(g.toFixed(2)));
      f.svg.append(node("text", { x: PAD.left - 5, y: y(g) + 4, class: "axis", "text-anchor": "end" }, label));
    }
    // Runs of known values, each an area and a line; a lone value is a dot.
    let run = [];
    const flush = () => {
      if (run.length === 1) {
        f.svg.append(node("circle", { cx: run[0][0], cy: run[0][1], r: 2.5, class: "dot" }));
      } else if (run.length > 1) {
        const pts = run.map(([px, py]) => `${px.toFixed(1)},${py.toFixed(1)}`).join(" ");
        const area = `${run[0][0].toFixed(1)},${f.base} ${pts} ${run[run.length - 1][0].toFixed(1)},${f.base}`;
        f.svg.append(node("polygon", { points: area, class: "area" }));
        f.svg.append(node("polyline", { points: pts, class: "line" }));
      }
      run = [];
    };
    values.forEach((v, i) => {
      if (finite(v)) run.push([f.x(t[i]), y(v)]);
      else flush();
    });
    flush();
    const unit = o.unit ? " " + o.unit : "";
    hover(fig, f, t, values, (v) => fmt(v, o.digits) + unit);
    f.plot.replaceChildren(f.svg);
    const last = [...values].reverse().find(finite);
    const now = fig.querySelector(".now");
    if (now) now.textContent = last === undefined ? "–" : fmt(last, o.digits);
    fig.dataset.points = String(known.length);
    fig.dataset.max = known.length ? String(Math.max(...known)) : "";
    fig.dataset.last = last === undefined ? "" : String(last);
  }

  const STATE_LABEL = { closed: "closed", half_open: "half-open", open: "open" };

  // One band per breaker: its state over time, coloured; hovering a stretch names it and when.
  function breakers(fig, t, states) {
    const names = Object.keys(states || {}).sort();
    const ROW = Math.round(Math.min(ROW_MAX, Math.max(ROW_MIN, (HEIGHT - PAD.top - PAD.bottom) / Math.max(1, names.length))));
    const height = PAD.top + Math.max(1, names.length) * ROW + PAD.bottom;
    const f = frame(fig, t, height, LABEL);
    let cells = 0;
    let open = 0;
    names.forEach((name, row) => {
      const top = PAD.top + row * ROW;
      const label = name.length > 20 ? name.slice(0, 19) + "…" : name;
      const text = node("text", { x: LABEL - 6, y: top + ROW / 2 + 4, class: "axis name", "text-anchor": "end" }, label);
      text.append(node("title", {}, name));
      f.svg.append(text);
      const column = states[name];
      let i = 0;
      while (i < t.length) {
        const s = column[i];
        let j = i + 1;
        while (j < t.length && column[j] === s) j++;
        if (s !== null && s !== undefined) {
          cells += j - i;
          if (s === "open") open += j - i;
          const x0 = f.x(t[i]);
          const x1 = j < t.length ? f.x(t[j]) : f.x(f.t1) + 2;
          const cls = "band b-" + String(s).replace(/[^a-z_]/g, "");
          const rect = node("rect", { x: x0, y: top + 3, width: Math.max(2, x1 - x0), height: ROW - 6, class: cls });
          rect.append(node("title", {}, `${name}: ${STATE_LABEL[s] || s} from ${clock(t[i])} to ${clock(t[Math.min(j, t.length - 1)])}`));
          f.svg.append(rect);
        }
        i = j;
      }
    });
    if (!names.length) {
      f.svg.append(node("text", { x: LABEL, y: PAD.top + ROW / 2 + 4, class: "axis" }, "no breakers yet"));
    }
    f.plot.replaceChildren(f.svg);
    const now = fig.querySelector(".now");
    const current = names.map((n) => states[n][states[n].length - 1]);
    const notClosed = current.filter((s) => s && s !== "closed").length;
    if (now) {
      now.textContent = !names.length ? "–" : notClosed ? `${notClosed} not closed` : "all closed";
      now.className = "now " + (notClosed ? "bad" : "ok");
    }
    fig.dataset.cells = String(cells);
    fig.dataset.open = String(open);
    fig.dataset.names = names.join(",");
  }

  window.AgentsStreamCharts = { line, breakers };
})();
