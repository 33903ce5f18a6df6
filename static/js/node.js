// Node page: one Chart.js chart per GPU (utilization, memory, temperature, power), last 15 minutes, live.
"use strict";
const WINDOW_MS = 15 * 60 * 1000;
const history = JSON.parse(document.getElementById("history").textContent);
const section = document.querySelector(".node-detail");
const charts = new Map();

function series(points, column) { return points.map((p) => ({ x: p[0], y: p[column] })); }

function makeChart(figure) {
  const gpuId = figure.dataset.gpu;
  const memTotal = parseFloat(figure.dataset.memory);
  const points = history[gpuId] || [];
  const chart = new Chart(figure.querySelector("canvas"), {
    type: "line",
    data: { datasets: [
      { label: "util %", data: series(points, 1), yAxisID: "pct", borderColor: "#1e88e5", pointRadius: 0, borderWidth: 1.5 },
      { label: "memory %", data: points.map((p) => ({ x: p[0], y: (100 * p[2]) / memTotal })), yAxisID: "pct", borderColor: "#8e24aa", pointRadius: 0, borderWidth: 1.5 },
      { label: "temp °C", data: series(points, 3), yAxisID: "pct", borderColor: "#f4511e", pointRadius: 0, borderWidth: 1 },
      { label: "power W", data: series(points, 4), yAxisID: "watts", borderColor: "#43a047", pointRadius: 0, borderWidth: 1 },
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

Live.onUpdate((msg) => {
  const mine = msg.nodes.find((n) => String(n.node) === section.dataset.node);
  if (!mine) return;
  const x = mine.t * 1000;
  for (const [gpuId, p] of Object.entries(mine.gpus)) {
    const entry = charts.get(gpuId);
    if (!entry) continue;
    const [util, used, , temp, power] = p;
    const values = [util, (100 * used) / entry.memTotal, temp, power];
    entry.chart.data.datasets.forEach((ds, i) => {
      ds.data.push({ x, y: values[i] });
      while (ds.data.length && ds.data[0].x < x - WINDOW_MS) ds.data.shift();
    });
    entry.chart.update("none");
  }
  window.layercakePoints = (window.layercakePoints || 0) + 1;
});
