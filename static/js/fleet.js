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

function showCell(cell, p) {
  cell.className = `u${Math.min(10, Math.max(0, Math.round((p.util || 0) / 10)))}`;
  cell.dataset.v = [p.util, p.mem_used, p.mem_total].map((v) => fmt(v, 0)).join(",");
}

// Hover: the cell's values, written when asked for (8,000 titles in the HTML would double the page).
if (heatmap) heatmap.addEventListener("mouseover", (ev) => {
  const cell = ev.target.closest("i");
  if (!cell) return;
  const node = cell.parentElement.title;
  const index = [...cell.parentElement.children].indexOf(cell);
  const [util, used, total] = (cell.dataset.v || "").split(",");
  cell.title = cell.dataset.v ? `${node} GPU${index}: ${util} %, ${used} / ${total} MiB` : `${node} GPU${index}: no sample`;
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
  for (const node of msg.nodes) {
    for (const [gpuId, values] of Object.entries(node.gpus)) {
      const cell = cells.get(gpuId);
      const row = rows.get(gpuId);
      if (!cell && !row) continue;
      const p = Live.point(msg.keys, values);
      if (cell) showCell(cell, p);
      if (row) showRow(row, p);
    }
  }
});
