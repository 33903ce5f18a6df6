// Deployment page: live state, tokens/s next to the deployment's GPUs' utilization.
"use strict";
const box = document.querySelector(".deployment-detail");
const figure = document.getElementById("tokens-figure");
const WINDOW = parseFloat(figure.dataset.minutes) * 60 * 1000;
const GAP_MS = 3 * parseFloat(figure.dataset.stepS) * 1000; // as dashboard.fleet.GAP_STEPS
const metrics = JSON.parse(document.getElementById("metrics").textContent);
const gpuHistory = JSON.parse(document.getElementById("gpu-history").textContent);
const palette = ["#1e88e5", "#43a047", "#fb8c00", "#8e24aa", "#00897b", "#e53935", "#5e35b1", "#6d4c41"];

const datasets = [{ label: "tokens/s", data: metrics.map((m) => ({ x: m[0], y: m[1] })), yAxisID: "tok",
                    borderColor: "#111", borderWidth: 2, pointRadius: 0 }];
Object.entries(gpuHistory.gpus).forEach(([gpuId, points], i) => datasets.push({
  label: `GPU util % (${gpuId})`, gpuId,
  data: points.map((values) => Live.point(gpuHistory.keys, values)).map((p) => ({ x: p.t, y: p.util })), yAxisID: "pct",
  borderColor: palette[i % palette.length], borderWidth: 1, pointRadius: 0 }));

const chart = new Chart(document.getElementById("tokens-chart"), {
  type: "line", data: { datasets },
  options: { animation: false, parsing: false, maintainAspectRatio: false,
    scales: { x: { type: "time", ticks: { maxTicksLimit: 8 } }, tok: { position: "left", min: 0, title: { display: true, text: "tokens/s" } },
              pct: { position: "right", min: 0, max: 100, grid: { drawOnChartArea: false } } } },
});

function addEvent(d) {
  const item = document.createElement("li");
  const time = document.createElement("time");
  time.textContent = new Date().toTimeString().slice(0, 8);
  const state = document.createElement("span");
  state.className = "state state-" + d.state;
  state.textContent = d.label;
  item.append(time, " ", state);
  document.getElementById("events").append(item);
}

function push(ds, x, y) {
  const last = ds.data.length ? ds.data[ds.data.length - 1].x : null;
  if (last !== null && x - last > GAP_MS) ds.data.push({ x: (x + last) / 2, y: null });
  ds.data.push({ x, y });
  while (ds.data.length && ds.data[0].x < x - WINDOW) ds.data.shift();
}

Live.onUpdate((msg) => {
  for (const d of msg.deployments || []) {
    if (d.id !== box.dataset.deployment) continue;
    const badge = document.getElementById("state");
    if (box.dataset.state !== d.state) addEvent(d);
    badge.textContent = d.label; badge.className = "state state-" + d.state;
    document.getElementById("progress").textContent =
      d.state === "loading" && d.progress !== null ? `loading ${Math.round(d.progress * 100)} %` : "";
    if (d.tokens_per_s !== null && d.t) push(datasets[0], d.t * 1000, d.tokens_per_s);
    box.dataset.state = d.state;
  }
  const node = msg.nodes.find((n) => String(n.node) === box.dataset.node);
  if (node) datasets.slice(1).forEach((ds) => { const p = node.gpus[ds.gpuId]; if (p) push(ds, node.t * 1000, Live.point(msg.keys, p).util); });
  chart.update("none");
});
