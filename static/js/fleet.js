// Fleet page: refresh each GPU's heatmap cell and, for the nodes on this page, its row from the live ticks.
// The cells and rows are looked up once (a Map by GPU id), not with querySelector per GPU per tick: at
// 1,000 nodes x 8 GPUs a tick carries 8,000 points.
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

const values = new Map(); // GPU id -> [util, used, total] as last shown: the hover reads it

function showCell(cell, util, used, total) {
  const bucket = `u${Math.min(10, Math.max(0, Math.round((util || 0) / 10)))}`;
  if (cell.className !== bucket) cell.className = bucket; // a write only when the colour changes
  values.set(cell.dataset.g, [util, used, total]);
}

// Hover: the cell's values, written when asked for (8,000 titles in the HTML would double the page).
if (heatmap) heatmap.addEventListener("mouseover", (ev) => {
  const cell = ev.target.closest("i");
  if (!cell) return;
  const node = cell.parentElement.title;
  const index = [...cell.parentElement.children].indexOf(cell);
  const [util, used, total] = values.get(cell.dataset.g) || (cell.dataset.v || "").split(",").filter(Boolean);
  cell.title = util === undefined ? `${node} GPU${index}: no sample` : `${node} GPU${index}: ${fmt(util, 0)} %, ${fmt(used, 0)} / ${fmt(total, 0)} MiB`;
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
      const cell = cells.get(gpuId);
      if (cell) showCell(cell, point[u], point[m], point[t]);
      const row = rows.get(gpuId);
      if (row) showRow(row, Live.point(msg.keys, point));
    }
  }
});
