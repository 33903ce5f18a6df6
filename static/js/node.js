// Node page: one Chart.js chart per GPU (utilization, memory, temperature, power) over the chosen range
// (raw samples live for 15m and 1h; minute or hour averages beyond). A row of nulls is a gap: no line across it.
"use strict";
const history = JSON.parse(document.getElementById("history").textContent); // {keys, gpus: {id: [values]}, step_s}
const section = document.querySelector(".node-detail");
const chartBox = document.querySelector(".charts");
const WINDOW_MS = parseFloat(chartBox.dataset.minutes) * 60 * 1000;
const GAP_MS = 3 * parseFloat(chartBox.dataset.stepS) * 1000; // as dashboard.fleet.GAP_STEPS
const LIVE = history.tier === "raw"; // longer ranges draw minute or hour averages, not live samples
const charts = new Map();

function series(points, key) { return points.map((p) => ({ x: p.t, y: p[key] })); }
function memoryPct(p, memTotal) { return p.mem_used === null ? null : (100 * p.mem_used) / memTotal; }

function makeChart(figure) {
  const gpuId = figure.dataset.gpu;
  const memTotal = parseFloat(figure.dataset.memory);
  const points = (history.gpus[gpuId] || []).map((values) => Live.point(history.keys, values));
  const chart = new Chart(figure.querySelector("canvas"), {
    type: "line",
    data: { datasets: [
      { label: "util %", data: series(points, "util"), yAxisID: "pct", borderColor: "#1e88e5", pointRadius: 0, borderWidth: 1.5 },
      { label: "memory %", data: points.map((p) => ({ x: p.t, y: memoryPct(p, memTotal) })), yAxisID: "pct", borderColor: "#8e24aa", pointRadius: 0, borderWidth: 1.5 },
      { label: "temp °C", data: series(points, "temp"), yAxisID: "pct", borderColor: "#f4511e", pointRadius: 0, borderWidth: 1 },
      { label: "power W", data: series(points, "power"), yAxisID: "watts", borderColor: "#43a047", pointRadius: 0, borderWidth: 1 },
    ] },
    options: {
      animation: false, parsing: false, normalized: true, maintainAspectRatio: false,
      scales: {
        x: { type: "time", time: { unit: "minute" } },
        pct: { position: "left", min: 0, max: 100 },
        watts: { position: "right", min: 0, grid: { drawOnChartArea: false } },
      },
      plugins: { legend: { labels: { boxWidth: 10 } } },
    },
  });
  charts.set(gpuId, { chart, memTotal });
}

document.querySelectorAll("figure.chart").forEach(makeChart);

function addPoint(entry, x, point) {
  const values = [point.util, memoryPct(point, entry.memTotal), point.temp, point.power];
  entry.chart.data.datasets.forEach((ds, i) => {
    const last = ds.data.length ? ds.data[ds.data.length - 1].x : -Infinity;
    if (x > last && x - last > GAP_MS && last > -Infinity) ds.data.push({ x: (x + last) / 2, y: null });
    if (x > last) ds.data.push({ x, y: values[i] });
    else if (!ds.data.some((d) => d.x === x)) { ds.data.push({ x, y: values[i] }); ds.data.sort((a, b) => a.x - b.x); }
    while (ds.data.length && ds.data[0].x < x - WINDOW_MS) ds.data.shift();
  });
}

Live.onUpdate((msg) => {
  if (!LIVE) return;
  const mine = msg.nodes.find((n) => String(n.node) === section.dataset.node);
  if (!mine) return;
  const x = mine.t * 1000;
  for (const [gpuId, p] of Object.entries(mine.gpus)) {
    const entry = charts.get(gpuId);
    if (!entry) continue;
    addPoint(entry, x, Live.point(msg.keys, p));
    entry.chart.update("none");
  }
  window.layercakePoints = (window.layercakePoints || 0) + 1;
});

// After a reconnect, fill the gap the page missed while its socket was down (the first open has the history).
function newestPoint() {
  let newest = 0;
  for (const { chart } of charts.values()) {
    const data = chart.data.datasets[0].data;
    if (data.length) newest = Math.max(newest, data[data.length - 1].x);
  }
  return newest;
}

Live.onOpen(async (opens) => {
  if (opens < 2 || !LIVE) return;
  const response = await fetch(`${location.pathname}history.json?range=${chartBox.dataset.range}&after=${newestPoint()}`);
  if (!response.ok) return;
  const missed = await response.json();
  for (const [gpuId, points] of Object.entries(missed.gpus)) {
    const entry = charts.get(gpuId);
    if (!entry) continue;
    points.map((values) => Live.point(missed.keys, values)).forEach((p) => addPoint(entry, p.t, p));
    entry.chart.update("none");
  }
  window.layercakeBackfilled = (window.layercakeBackfilled || 0) + Object.values(missed.gpus).flat().length;
});

// The deployments on this node: state and tokens/s as the live ticks report them.
Live.onUpdate((msg) => {
  for (const d of msg.deployments || []) {
    const row = document.querySelector(`#node-deployments tr[data-deployment="${d.id}"]`);
    if (!row) continue;
    const badge = row.querySelector(".state");
    badge.textContent = d.label; badge.className = "state state-" + d.state;
    row.querySelector(".tok").textContent = d.tokens_per_s === null ? "–" : Number(d.tokens_per_s).toFixed(1);
  }
});
