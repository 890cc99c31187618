// corral dashboard: renders the trial snapshots sent by /events and follows one
// worker's log from /logs. No libraries; the plots are drawn as inline SVG.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const WINDOW_SECONDS = 3600;  // the history the controller keeps (down-sampled past 5 min)
const MAX_LOG_LINES = 5000;
let updates = 0;
let logSource = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  return node;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "";
  seconds = Math.max(0, Math.floor(seconds));
  const d = Math.floor(seconds / 86400), h = Math.floor(seconds / 3600) % 24;
  const m = Math.floor(seconds / 60) % 60, s = seconds % 60;
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  if (m) return `${m}m ${s}s`;
  return `${s}s`;
}

function num(value, digits) {
  return value === null || value === undefined ? "" : Number(value).toFixed(digits);
}

function ms(value) {
  // a latency, or "–" when there were no calls in the window
  return value === null || value === undefined ? "–" : Number(value).toFixed(3);
}

function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return i ? `${n.toFixed(1)} ${units[i]}` : `${n} B`;
}

function clock(unix) {
  return unix ? new Date(unix * 1000).toLocaleTimeString() : "";
}

// ------------------------------------------------------------------ plots
function plot(points, series, unit) {
  // points: [[unix, rate, p50, p99], ...]; series: [[index, css class], ...]
  const W = 320, H = 96, L = 34, B = 14, T = 6;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
  const now = points.length ? points[points.length - 1][0] : Date.now() / 1000;
  // the x axis spans the history there is: at least a minute, at most WINDOW_SECONDS
  const span = Math.min(WINDOW_SECONDS, Math.max(60, points.length ? now - points[0][0] : 0));
  let top = 0;
  for (const p of points) for (const [i] of series) if (p[i] !== null) top = Math.max(top, p[i]);
  top = top > 0 ? top * 1.1 : 1;
  const x = (t) => L + ((t - (now - span)) / span) * (W - L - 2);
  const y = (v) => T + (1 - v / top) * (H - T - B);
  root.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - 2, y2: H - B }));
  root.append(svg("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  const label = (text, attrs) => { const t = svg("text", attrs); t.textContent = text; root.append(t); };
  label(`${top >= 10 ? top.toFixed(0) : top.toPrecision(2)} ${unit}`, { x: 2, y: T + 8 });
  label(`0`, { x: 2, y: H - B });
  label(span >= 120 ? `-${Math.round(span / 60)}m` : `-${Math.round(span)}s`, { x: L, y: H - 2 });
  label("now", { x: W - 20, y: H - 2 });
  for (const [i, cls] of series) {
    let path = "";
    let pen = "M";
    for (const p of points) {
      if (p[0] < now - span) continue;
      if (p[i] === null) { pen = "M"; continue; }
      path += `${pen}${x(p[0]).toFixed(1)},${y(p[i]).toFixed(1)} `;
      pen = "L";
    }
    if (path) root.append(svg("path", { class: cls, d: path }));
  }
  return root;
}

function roleCharts(trial) {
  const box = el("div", { class: "charts" });
  for (const role of trial.roles) {
    if (role.kind === "reused" || (!role.calls.total && !role.calls.in_flight)) continue;
    const h = role.calls.history || [];
    box.append(
      el("figure", { "data-role": role.role, class: "chart" },
        el("figcaption", {}, el("b", {}, `${role.role} · calls/s`),
          el("span", { class: "legend" }, el("span", { class: "k-rate" }, `${num(role.calls.rate, 1)}/s`))),
        plot(h, [[1, "rate"]], "/s")),
      el("figure", { "data-role": role.role, class: "chart" },
        el("figcaption", {}, el("b", {}, `${role.role} · latency`),
          el("span", { class: "legend" },
            el("span", { class: "k-p50" }, `p50 ${ms(role.calls.p50_ms)} ms`),
            el("span", { class: "k-p99" }, `p99 ${ms(role.calls.p99_ms)} ms`))),
        plot(h, [[2, "p50"], [3, "p99"]], "ms")));
  }
  return box;
}

// ------------------------------------------------------------------ tables
function rolesTable(trial) {
  const head = ["role", "kind", "replicas", "calls", "errors", "in flight", "calls/s", "p50 ms", "p99 ms"];
  const body = trial.roles.map((r) =>
    el("tr", { "data-role": r.role },
      el("td", {}, r.role),
      el("td", {}, r.target ? `${r.kind} on ${r.target}` : r.kind),
      el("td", { class: "num" }, r.replicas),
      el("td", { class: "num calls-total" }, r.calls.total),
      el("td", { class: "num" }, r.calls.errors),
      el("td", { class: "num in-flight" }, r.calls.in_flight),
      el("td", { class: "num rate" }, num(r.calls.rate, 1)),
      el("td", { class: "num p50" }, ms(r.calls.p50_ms)),
      el("td", { class: "num p99" }, ms(r.calls.p99_ms))));
  return el("table", { class: "roles-table" },
    el("thead", {}, el("tr", {}, ...head.map((h, i) => el("th", { class: i > 1 ? "num" : null }, h)))),
    el("tbody", {}, ...body));
}

function methodsTable(trial) {
  const rows = [];
  for (const r of trial.roles) {
    for (const [m, k] of Object.entries(r.methods || {}).sort()) rows.push([r.role, m, k]);
  }
  if (!rows.length) return null;
  const head = ["role", "method", "calls", "errors", "calls/s", "p50 ms", "p99 ms"];
  return el("table", { class: "methods-table" },
    el("thead", {}, el("tr", {}, ...head.map((h, i) => el("th", { class: i > 1 ? "num" : null }, h)))),
    el("tbody", {}, ...rows.map(([role, m, k]) =>
      el("tr", { "data-role": role, "data-method": m },
        el("td", {}, role), el("td", {}, m),
        el("td", { class: "num calls-total" }, k.total), el("td", { class: "num" }, k.errors),
        el("td", { class: "num rate" }, num(k.rate, 1)),
        el("td", { class: "num p50" }, ms(k.p50_ms)), el("td", { class: "num p99" }, ms(k.p99_ms))))));
}

function use(w) {
  if (w.cpu_percent === null || w.cpu_percent === undefined) return "";
  let text = `${Number(w.cpu_percent).toFixed(0)}% · ${bytes(w.rss_bytes)}`;
  if (w.gpu_util !== null && w.gpu_util !== undefined) text += ` · GPU ${Number(w.gpu_util).toFixed(0)}% ${bytes(w.gpu_mem_bytes)}`;
  return text;
}

function placement(w) {
  if (w.backend === "slurm" && w.backend_id && !w.forked_from) return `job ${w.backend_id} · pid ${w.pid ?? ""}`;
  if (w.backend === "ray" && w.backend_id) return `${w.backend_id} · pid ${w.pid ?? ""}`;
  return w.pid ? `pid ${w.pid}` : "";
}

function workersTable(trial) {
  const head = ["worker", "backend", "host", "GPUs", "pid / job / actor", "started", "state",
    "uptime", "restarts", "exit code", "calls", "errors", "p50 ms", "CPU · memory", "ended", ""];
  const rows = trial.workers.map((w) => {
    const alive = ["running", "registered"].includes(w.state) && w.started;
    const genTime = w.started ? clock(w.started) : "";
    return el("tr", { "data-worker": w.id, "data-state": w.state },
      el("td", { class: "worker-id" }, w.id, w.forked_from ? el("span", { class: "meta" }, ` forked on ${w.forked_from}`) : null),
      el("td", {}, w.backend),
      el("td", { class: "host" }, w.host || ""),
      el("td", { class: "gpus" }, w.gpus === null || w.gpus === undefined ? "" : (w.gpus === "" ? "none" : w.gpus)),
      el("td", { class: "placement" }, placement(w)),
      el("td", { class: "generation", title: w.generation || "" }, genTime),
      el("td", { class: "state" }, el("span", { class: `badge ${w.state}` }, w.state)),
      el("td", { class: "num uptime" }, alive ? duration(trial.time - w.started)
        : (w.duration !== null && w.duration !== undefined ? `ran ${duration(w.duration)}` : "")),
      el("td", { class: "num restarts" }, w.restarts),
      el("td", { class: "num exit-code" }, w.exit_code === null || w.exit_code === undefined ? "" : w.exit_code),
      el("td", { class: "num calls-total" }, w.calls ? w.calls.total : ""),
      el("td", { class: "num errors" }, w.calls ? w.calls.errors : ""),
      el("td", { class: "num p50" }, w.calls ? ms(w.calls.p50_ms) : ""),
      el("td", { class: "use" }, use(w)),
      el("td", { class: "ended" }, clock(w.ended || w.died_at)),
      el("td", {}, el("button", { type: "button", class: "log-button",
        onclick: () => openLog(trial.experiment, trial.trial, w.id) }, "logs")));
  });
  return el("table", { class: "workers-table" },
    el("thead", {}, el("tr", {}, ...head.map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows));
}

function failures(trial) {
  const failed = trial.workers.filter((w) => w.state === "failed");
  if (!failed.length) return null;
  return el("div", { class: "failures" }, ...failed.map((w) =>
    el("div", { class: "failure", "data-worker": w.id },
      el("h3", {}, `${w.id} failed`,
        w.exit_code === null || w.exit_code === undefined ? "" : ` · exit code ${w.exit_code}`,
        w.died_at ? ` · died at ${clock(w.died_at)}` : "",
        w.reason ? ` · ${w.reason}` : ""),
      el("pre", { class: "log-tail" }, w.log_tail || "(empty log)"))));
}

function trialSection(t) {
  const c = t.controller || {};
  return el("section", { class: "trial", "data-trial": `${t.experiment}/${t.trial}`, "data-status": t.status },
    el("h2", {}, `${t.experiment} / ${t.trial}`,
      el("span", { class: `badge ${t.status}` }, t.status),
      el("span", { class: "meta" },
        `${t.backend || "backend unknown"} · controller pid ${c.pid} on ${c.host}` +
        (c.started ? ` · up ${duration(t.time - c.started)}` : "") +
        (t.status === "registered" ? " · no stats file: workers from name-resolve only" : "") +
        (["live", "registered"].includes(t.status) ? "" : ` · last update ${duration(t.age)} ago`))),
    rolesTable(t), roleCharts(t), methodsTable(t), workersTable(t), failures(t),
    t.resources_note ? el("p", { class: "meta" }, t.resources_note) : null,
    t.records_note ? el("p", { class: "meta warn records-note" }, t.records_note) : null);
}

function render(trials) {
  const main = document.getElementById("trials");
  const sections = trials.map(trialSection);
  main.replaceChildren(...(sections.length ? sections : [el("p", { class: "empty" }, "no trials found")]));
  updates += 1;
  document.body.dataset.updates = String(updates);
  document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
}

// ------------------------------------------------------------------ logs
function openLog(experiment, trial, worker) {
  if (logSource) logSource.close();
  const panel = document.getElementById("log-panel");
  const view = document.getElementById("log-view");
  panel.hidden = false;
  panel.dataset.worker = `${experiment}/${trial}/${worker}`;
  document.getElementById("log-title").textContent = `${experiment} / ${trial} · ${worker}`;
  document.getElementById("log-path").textContent = "";
  view.replaceChildren();
  history.replaceState(null, "", `#log=${encodeURIComponent(`${experiment}/${trial}/${worker}`)}`);
  const search = document.getElementById("log-search").value;
  const q = new URLSearchParams({ experiment, trial, worker });
  if (search) q.set("q", search);  // the whole file's matching lines, then new ones
  logSource = new CorralEventSource(`/logs?${q}`);
  logSource.addEventListener("path", (ev) => {
    document.getElementById("log-path").textContent = JSON.parse(ev.data);
  });
  logSource.addEventListener("lines", (ev) => {
    const lines = JSON.parse(ev.data);
    for (const line of lines) view.append(el("div", { class: "log-line" }, line));
    while (view.childElementCount > MAX_LOG_LINES) view.firstElementChild.remove();
    if (document.getElementById("log-follow").checked) view.scrollTop = view.scrollHeight;
  });
}

function closeLog() {
  if (logSource) logSource.close();
  logSource = null;
  document.getElementById("log-panel").hidden = true;
  history.replaceState(null, "", "#");
}

function start() {
  document.getElementById("log-close").addEventListener("click", closeLog);
  document.getElementById("log-search").addEventListener("change", () => {
    const panel = document.getElementById("log-panel");
    const [experiment, trial, ...rest] = (panel.dataset.worker || "").split("/");
    if (!panel.hidden && experiment && trial) openLog(experiment, trial, rest.join("/"));
  });
  const conn = document.getElementById("conn");
  const events = new CorralEventSource("/events");
  events.addEventListener("open", () => { conn.dataset.state = "live"; conn.textContent = "live"; });
  events.addEventListener("error", () => { conn.dataset.state = "reconnecting"; conn.textContent = "reconnecting"; });
  events.addEventListener("trials", (ev) => render(JSON.parse(ev.data)));
  const wanted = decodeURIComponent(location.hash.replace(/^#log=/, ""));
  if (location.hash.startsWith("#log=")) {
    const [experiment, trial, ...rest] = wanted.split("/");
    if (experiment && trial && rest.length === 2) openLog(experiment, trial, rest.join("/"));
  }
}

start();
