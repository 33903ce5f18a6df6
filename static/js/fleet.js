// Fleet page. The GPU heatmap is one canvas (one cell per GPU, grouped by node), drawn from the page's data
// (#heatmap-data, dashboard/fleet_view.py) and kept live by the server's heatmap messages: the cells that
// changed and the nodes that reported (dashboard/subscriptions.py). Only changed cells are repainted, once a
// frame: 8,000 cells as elements made every tick restyle them. Hover shows a GPU's values (its node is
// watched while the pointer rests on it), click opens the node, and the arrow keys and Enter do the same from
// the keyboard; the node list below the heatmap has every value as text. The summary line is recounted from
// the same data and the page's live messages. The node cards' rows come from the ticks, which carry only
// those nodes.
"use strict";
function fmt(v, digits) { return v === null || v === undefined ? "–" : Number(v).toFixed(digits); }

const PALETTE = ["#e3f2fd", "#bbdefb", "#90caf9", "#64b5f6", "#42a5f5", "#2196f3", "#1e88e5", "#1976d2", "#1565c0", "#0d47a1", "#08306b"];
const NO_SAMPLE = "#9e9e9e", DOWN = "#c62828", LINE = "#d1d5db";
const CELL_W = 8, CELL_H = 14, CELL_GAP = 1, PAD = 2, NODE_GAP = 3, BOX_H = CELL_H + 2 * PAD;
const MEM_STEP_MIB = 256; // dashboard.live.heat_cell: utilization colour in the low 4 bits, memory used above
const STATES = ["online", "stale", "offline", "new"];

const source = document.getElementById("heatmap-data");
const data = source ? JSON.parse(source.textContent) : null;
const canvas = document.getElementById("heatmap-canvas");
const tip = document.getElementById("heatmap-tip");
const ctx = canvas ? canvas.getContext("2d") : null;
const loadedAt = Date.now();
const nodes = data ? data.nodes.map(([id, name, status, interval, gpus, cells, util, used, total]) =>
  ({ id: String(id), name, status, interval, gpus, cells, util, used, total, seen: loadedAt, x: 0, y: 0, w: 0 })) : [];
const nodeById = new Map(nodes.map((n) => [n.id, n]));
const gpuAt = new Map(); // GPU id (a number) -> [node, index in it]
nodes.forEach((n) => n.gpus.forEach((g, i) => gpuAt.set(g, [n, i])));
const deployments = new Map(Object.entries(data ? data.deployments : {}));
const openAlerts = new Set(data ? data.open_alerts : []);
let colourBy = "util";

function layout() {
  const width = canvas.clientWidth;
  let x = 0, y = 0;
  for (const n of nodes) {
    n.w = 2 * PAD + n.gpus.length * (CELL_W + CELL_GAP) - (n.gpus.length ? CELL_GAP : 0);
    if (x > 0 && x + n.w > width) { x = 0; y += BOX_H + NODE_GAP; }
    n.x = x; n.y = y; x += n.w + NODE_GAP;
  }
  const height = nodes.length ? y + BOX_H : 0, ratio = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * ratio); canvas.height = Math.round(height * ratio);
  canvas.style.height = `${height}px`;
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  nodes.forEach(drawNode);
}

function colourOf(n, i) {
  const cell = n.cells[i];
  if (cell < 0) return NO_SAMPLE;
  if (colourBy === "util") return PALETTE[cell & 15];
  return PALETTE[Math.max(0, Math.min(10, Math.floor((10 * (cell >> 4) * MEM_STEP_MIB) / (n.total[i] || 1))))];
}

function drawCell(n, i) {
  ctx.fillStyle = colourOf(n, i);
  ctx.fillRect(n.x + PAD + i * (CELL_W + CELL_GAP), n.y + PAD, CELL_W, CELL_H);
}

function drawNode(n) {
  ctx.clearRect(n.x, n.y, n.w, BOX_H);
  ctx.strokeStyle = n.status === "stale" || n.status === "offline" ? DOWN : LINE;
  ctx.lineWidth = 1;
  ctx.strokeRect(n.x + 0.5, n.y + 0.5, n.w - 1, BOX_H - 1);
  n.gpus.forEach((_, i) => drawCell(n, i));
}

// What changed since the last frame: painted together, once.
const dirtyCells = new Set(), dirtyNodes = new Set();
let framePending = false, summaryDirty = true;
function paintSoon() {
  if (framePending || !ctx) return;
  framePending = true;
  requestAnimationFrame(() => {
    framePending = false;
    dirtyNodes.forEach(drawNode);
    dirtyCells.forEach(([n, i]) => { if (!dirtyNodes.has(n)) drawCell(n, i); });
    dirtyNodes.clear(); dirtyCells.clear();
  });
}

function setStatus(n, status) {
  if (n.status === status) return;
  n.status = status; dirtyNodes.add(n); summaryDirty = true; paintSoon();
}

function reported(nodeId) {
  const n = nodeById.get(String(nodeId));
  if (!n) return;
  n.seen = Date.now();
  setStatus(n, "online");
}

Live.onHeatmap((msg) => {
  // The cells that changed (now and then all of them), in runs of consecutive GPU ids: [first id, count,
  // cell, cell, ..., first id, count, ...] (dashboard.live.heat_runs).
  const cells = msg.cells;
  for (let k = 0; k < cells.length;) {
    const first = cells[k], count = cells[k + 1];
    k += 2;
    for (let j = 0; j < count; j++, k++) {
      const at = gpuAt.get(first + j);
      if (!at || at[0].cells[at[1]] === cells[k]) continue;
      at[0].cells[at[1]] = cells[k];
      dirtyCells.add(at);
    }
  }
  (msg.nodes || []).forEach(reported);
  summaryDirty = true;
  paintSoon();
});

Live.onNode((msg) => {
  const n = nodeById.get(String(msg.node));
  if (n) { if (msg.status === "online") n.seen = Date.now(); setStatus(n, msg.status); }
});

Live.onAlert((msg) => {
  if (["open", "acknowledged"].includes(msg.alert.status)) openAlerts.add(msg.alert.id); else openAlerts.delete(msg.alert.id);
  summaryDirty = true;
});

// A node goes stale on the page as on the server: no report for STALE_AFTER_INTERVALS of its intervals.
function markStale() {
  if (!data) return;
  const now = Date.now();
  for (const n of nodes) {
    if (n.status === "online" && n.seen + n.interval * 1000 * data.stale_after_intervals < now) setStatus(n, "stale");
  }
}

// Hover, click and keyboard: which cell is where is arithmetic over the node boxes laid out above.
function cellAt(ev) {
  const r = canvas.getBoundingClientRect(), x = ev.clientX - r.left, y = ev.clientY - r.top;
  const n = nodes.find((m) => x >= m.x && x < m.x + m.w && y >= m.y && y < m.y + BOX_H);
  if (!n || !n.gpus.length) return null;
  return [n, Math.max(0, Math.min(n.gpus.length - 1, Math.floor((x - n.x - PAD) / (CELL_W + CELL_GAP))))];
}

function describe([n, i]) {
  const head = `${n.name} (${n.status}) GPU${i}`;
  return n.util[i] === null ? `${head}: no sample` : `${head}: ${fmt(n.util[i], 0)} %, ${fmt(n.used[i], 0)} / ${fmt(n.total[i], 0)} MiB`;
}

let pointed = null, watchTimer = null;
function point(at) {
  if (at ? pointed && at[0] === pointed[0] && at[1] === pointed[1] : !pointed) return;
  pointed = at;
  clearTimeout(watchTimer); // sweeping across the heatmap subscribes only where the pointer rests
  if (!at) { tip.hidden = true; watchTimer = setTimeout(() => Live.watch(null), 1000); return; }
  showTip();
  watchTimer = setTimeout(() => Live.watch(Number(at[0].id)), 150);
}

function showTip() {
  if (!pointed) return;
  const [n] = pointed;
  tip.textContent = describe(pointed);
  tip.hidden = false;
  tip.style.left = `${Math.max(0, Math.min(n.x, canvas.clientWidth - tip.offsetWidth))}px`;
  tip.style.top = `${n.y + BOX_H + 2}px`;
}

function openNode(at) { if (at) location.href = `/nodes/${encodeURIComponent(at[0].name)}/`; }

const ORDER = nodes.flatMap((n) => n.gpus.map((_, i) => [n, i])); // every cell, in the heatmap's order
function step(at, key) {
  if (!at) return ORDER.length ? ORDER[0] : null;
  const k = ORDER.findIndex(([n, i]) => n === at[0] && i === at[1]);
  if (key === "ArrowRight") return ORDER[Math.min(ORDER.length - 1, k + 1)];
  if (key === "ArrowLeft") return ORDER[Math.max(0, k - 1)];
  const dir = key === "ArrowDown" ? 1 : -1; // up and down: the previous or next node's first GPU
  for (let j = nodes.indexOf(at[0]) + dir; j >= 0 && j < nodes.length; j += dir) {
    if (nodes[j].gpus.length) return [nodes[j], 0];
  }
  return at;
}

if (canvas) {
  canvas.addEventListener("mousemove", (ev) => point(cellAt(ev)));
  canvas.addEventListener("mouseleave", () => point(null));
  canvas.addEventListener("click", (ev) => openNode(cellAt(ev)));
  canvas.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter") { openNode(pointed); return; }
    if (!["ArrowRight", "ArrowLeft", "ArrowDown", "ArrowUp"].includes(ev.key)) return;
    ev.preventDefault();
    point(step(pointed, ev.key));
  });
  canvas.addEventListener("blur", () => point(null));
  document.getElementById("heatmap-colour").addEventListener("change", (ev) => {
    colourBy = ev.target.value;
    nodes.forEach(drawNode);
  });
  let resizing = false;
  window.addEventListener("resize", () => {
    if (resizing) return;
    resizing = true;
    requestAnimationFrame(() => { resizing = false; layout(); showTip(); });
  });
  layout();
}

// The summary line, recounted at most once a second from the heatmap's cells, the nodes' states, and the
// deployments and alerts the page was told of (dashboard.fleet_view.summary counts the same at page load).
function setText(id, text) {
  const el = document.getElementById(id);
  if (el && el.textContent !== text) el.textContent = text;
}

function countGpus() {
  const c = { busy: 0, idle: 0, silent: 0, used: 0, free: 0 };
  for (const n of nodes) {
    n.cells.forEach((cell, i) => {
      if (n.status !== "online" || cell < 0) { c.silent += 1; return; }
      if ((cell & 15) >= 1) c.busy += 1; else c.idle += 1; // colour 1 and up: 10 % and up (BUSY_UTIL)
      c.used += (cell >> 4) * MEM_STEP_MIB;
      c.free += Math.max(0, n.total[i] - (cell >> 4) * MEM_STEP_MIB);
    });
  }
  return c;
}

function showStates() {
  const counts = {};
  nodes.forEach((n) => { counts[n.status] = (counts[n.status] || 0) + 1; });
  const el = document.getElementById("sum-states");
  const text = STATES.filter((s) => counts[s]).map((s) => `${counts[s]} ${s}`).join(" ");
  if (el.dataset.shown === text) return;
  el.dataset.shown = text;
  el.replaceChildren(...STATES.filter((s) => counts[s]).flatMap((s) => {
    const badge = document.createElement("span");
    badge.className = `status status-${s}`; badge.textContent = `${counts[s]} ${s}`;
    return [badge, " "];
  }));
}

function showSummary() {
  if (!summaryDirty || !data || !document.getElementById("fleet-summary")) return;
  summaryDirty = false;
  showStates();
  const c = countGpus();
  setText("gpus-busy", String(c.busy));
  setText("gpus-idle", String(c.idle));
  setText("gpus-silent", c.silent ? `, ${c.silent} silent` : "");
  setText("mem-used", String(Math.round(c.used / 1024)));
  setText("mem-free", String(Math.round(c.free / 1024)));
  const states = {};
  deployments.forEach((state) => { if (state !== "stopped") states[state] = (states[state] || 0) + 1; });
  const parts = Object.keys(states).sort().map((s) => `${states[s]} ${(data.state_labels[s] || s).toLowerCase()}`);
  setText("sum-deployments", parts.join(", ") || "none");
  setText("sum-alerts", `${openAlerts.size} open alert${openAlerts.size === 1 ? "" : "s"}`);
}
setInterval(() => { markStale(); showSummary(); }, 1000);

const rows = new Map([...document.querySelectorAll("tr.gpu")].map((el) => [el.dataset.gpu, el]));

function showDeployment(d) {
  if (deployments.get(d.id) !== d.state) { deployments.set(d.id, d.state); summaryDirty = true; }
  const row = document.querySelector(`tr.deployment[data-deployment="${d.id}"]`);
  if (!row) return;
  const badge = row.querySelector(".state");
  badge.textContent = d.label; badge.className = "state state-" + d.state;
  row.querySelector(".tok").textContent = d.tokens_per_s === null ? "–" : Number(d.tokens_per_s).toFixed(1);
  row.querySelector(".running").textContent = d.running === null ? "–" : d.running;
}

function showRow(row, p) {
  row.querySelector(".util").textContent = `${fmt(p.util, 0)} %`;
  row.querySelector(".fill").style.width = `${p.mem_total ? (100 * p.mem_used) / p.mem_total : 0}%`;
  row.querySelector(".mem").textContent = `${fmt(p.mem_used, 0)} / ${fmt(p.mem_total, 0)} MiB`;
  row.querySelector(".temp").textContent = `${fmt(p.temp, 0)} °C`;
  row.querySelector(".power").textContent = `${fmt(p.power, 0)} W`;
}

Live.onUpdate((msg) => {
  (msg.deployments || []).forEach(showDeployment);
  const [u, m, t] = ["util", "mem_used", "mem_total"].map((key) => msg.keys.indexOf(key));
  for (const node of msg.nodes) {
    reported(node.node);
    for (const [gpuId, p] of Object.entries(node.gpus)) {
      const at = gpuAt.get(Number(gpuId));
      if (at) { at[0].util[at[1]] = p[u]; at[0].used[at[1]] = p[m]; at[0].total[at[1]] = p[t]; }
      const row = rows.get(gpuId);
      if (row) showRow(row, Live.point(msg.keys, p));
    }
  }
  if (pointed) showTip();
});
