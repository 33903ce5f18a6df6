// Fleet page: the heatmap's colours from the server's heatmap messages (only the cells that changed), and the
// rows of the node cards on this page from the ticks, which carry only those nodes (dashboard/subscriptions.py).
// Hovering a cell asks for its node's values for the moment (Live.watch). Cells and rows are looked up once
// (a Map by GPU id), not with querySelector per GPU per message.
"use strict";
function fmt(v, digits) { return v === null || v === undefined ? "–" : Number(v).toFixed(digits); }

const heatmap = document.getElementById("heatmap");
const cells = new Map([...document.querySelectorAll("#heatmap i")].map((el) => [el.dataset.g, el]));
const rows = new Map([...document.querySelectorAll("tr.gpu")].map((el) => [el.dataset.gpu, el]));

function showDeployment(d) {
  const row = document.querySelector(`tr.deployment[data-deployment="${d.id}"]`);
  if (!row) return;
  const badge = row.querySelector(".state");
  badge.textContent = d.label; badge.className = "state state-" + d.state;
  row.querySelector(".tok").textContent = d.tokens_per_s === null ? "–" : Number(d.tokens_per_s).toFixed(1);
  row.querySelector(".running").textContent = d.running === null ? "–" : d.running;
}

Live.onHeatmap((msg) => {
  for (const gpuId in msg.cells) {
    const cell = cells.get(gpuId);
    const colour = "u" + msg.cells[gpuId];
    if (cell && cell.className !== colour) cell.className = colour; // a write only when the colour changes
  }
});

// Hover: the cell's values, written when asked for (8,000 titles in the HTML would double the page). The
// values of a node not shown in detail come from watching it while the pointer is on it.
const values = new Map(); // GPU id -> [util, used, total] as last received; before that the page's data-v
let hovered = null;

function describe(cell) {
  const node = cell.parentElement.title;
  const index = [...cell.parentElement.children].indexOf(cell);
  const [util, used, total] = values.get(cell.dataset.g) || (cell.dataset.v || "").split(",").filter(Boolean);
  return util === undefined ? `${node} GPU${index}: no sample` : `${node} GPU${index}: ${fmt(util, 0)} %, ${fmt(used, 0)} / ${fmt(total, 0)} MiB`;
}

let watchTimer = null;
if (heatmap) heatmap.addEventListener("mouseover", (ev) => {
  const cell = ev.target.closest("i");
  if (!cell) return;
  hovered = cell;
  cell.title = describe(cell);
  const nodeId = Number(cell.parentElement.dataset.hm);
  clearTimeout(watchTimer); // sweeping across the heatmap subscribes only where the pointer rests
  watchTimer = setTimeout(() => Live.watch(nodeId), 150);
});
if (heatmap) heatmap.addEventListener("mouseleave", () => {
  hovered = null;
  clearTimeout(watchTimer);
  watchTimer = setTimeout(() => Live.watch(null), 1000);
});

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
    for (const [gpuId, point] of Object.entries(node.gpus)) {
      values.set(gpuId, [point[u], point[m], point[t]]);
      const row = rows.get(gpuId);
      if (row) showRow(row, Live.point(msg.keys, point));
    }
  }
  if (hovered) hovered.title = describe(hovered);
});
