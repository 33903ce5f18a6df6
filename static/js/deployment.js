// Deployment page: live state, tokens/s next to the deployment's GPUs' utilization.
"use strict";
const box = document.querySelector(".deployment-detail");
const figure = document.getElementById("tokens-figure");
const WINDOW = parseFloat(figure.dataset.minutes) * 60 * 1000;
const GAP_MS = 3 * parseFloat(figure.dataset.stepS) * 1000; // as dashboard.fleet.GAP_STEPS
const metrics = JSON.parse(document.getElementById("metrics").textContent);
const gpuHistory = JSON.parse(document.getElementById("gpu-history").textContent);
const gpuNames = JSON.parse(document.getElementById("gpu-names").textContent); // GPU id -> "GPU0" as the node names it
const palette = ["#1e88e5", "#43a047", "#fb8c00", "#8e24aa", "#00897b", "#e53935", "#5e35b1", "#6d4c41"];

const datasets = [{ label: "tokens/s", data: metrics.map((m) => ({ x: m[0], y: m[1] })), yAxisID: "tok",
                    borderColor: "#111", borderWidth: 2, pointRadius: 0 }];
Object.entries(gpuHistory.gpus).forEach(([gpuId, points], i) => datasets.push({
  label: `${gpuNames[gpuId] || "GPU"} util %`, gpuId,
  data: points.map((values) => Live.point(gpuHistory.keys, values)).map((p) => ({ x: p.t, y: p.util })), yAxisID: "pct",
  borderColor: palette[i % palette.length], borderWidth: 1, pointRadius: 0 }));

const chart = new Chart(document.getElementById("tokens-chart"), {
  type: "line", data: { datasets },
  options: { animation: false, parsing: false, maintainAspectRatio: false,
    scales: { x: { type: "time", ticks: { maxTicksLimit: 8 } }, tok: { position: "left", min: 0, title: { display: true, text: "tokens/s" } },
              pct: { position: "right", min: 0, max: 100, grid: { drawOnChartArea: false } } } },
});

document.querySelectorAll("button.copy").forEach((button) => button.addEventListener("click", async () => {
  await navigator.clipboard.writeText(document.getElementById(button.dataset.copy).textContent);
  button.textContent = "Copied";
}));

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

// "Try it" and "Measure": asks sent on the live socket; the agent's answers come back on it.
const asks = new Map(); // request id -> { kind: "try" | "measure" }
const pending = new Map(); // the page's ref -> kind, until the server names the request
let askCount = 0;
const ASK_GIVE_UP_MS = 180 * 1000; // the agent gives a silent server 120 s before it answers with the error

function num(value, digits) { return value === null || value === undefined ? "–" : Number(value).toFixed(digits); }
function ms(value) { return value === null || value === undefined ? "–" : `${Math.round(value * 1000)} ms`; }

function ask(kind, fields) {
  const ref = `${kind}-${++askCount}`;
  pending.set(ref, kind);
  const sent = Live.send({ type: "ask", ref, deployment: box.dataset.deployment, ...fields });
  document.getElementById(`${kind}-status`).textContent = sent ? "sent…" : "the live connection is down; try again in a moment";
}

function addMeasurement(msg) {
  const m = msg.measurement || {};
  const table = document.getElementById("measurements");
  const row = document.createElement("tr");
  row.className = "measurement"; row.dataset.request = msg.request;
  const cells = [new Date().toTimeString().slice(0, 8), m.streams, num(m.tok_s_per_stream, 1), num(table.dataset.predicted || null, 1),
    num(m.tok_s_total, 1), ms(m.ttft_s), ms(m.itl_s), msg.error ? `Failed: ${msg.error}` : "Done"];
  const classes = ["", "num", "num per-stream", "num predicted", "num total", "num ttft", "num itl", ""];
  cells.forEach((text, i) => { const td = document.createElement("td"); td.className = classes[i]; td.textContent = text; row.append(td); });
  table.querySelector("tbody").prepend(row);
  table.hidden = false;
}

Live.onAsk((msg) => {
  if (msg.type === "fleet.refused" || msg.type === "fleet.asked") {
    const kind = pending.get(msg.ref);
    if (!kind) return;
    pending.delete(msg.ref);
    if (msg.type === "fleet.refused") { document.getElementById(`${kind}-status`).textContent = msg.error; return; }
    asks.set(msg.request, kind);
    document.getElementById(`${kind}-status`).textContent = kind === "try" ? "streaming…" : "measuring…";
    // An agent that is offline, or too old to know asks, never answers: say so rather than wait forever.
    setTimeout(() => {
      if (asks.get(msg.request) !== kind) return;
      asks.delete(msg.request);
      document.getElementById(`${kind}-status`).textContent = "no answer from the node's agent within 3 minutes";
    }, ASK_GIVE_UP_MS);
    return;
  }
  const kind = asks.get(msg.request);
  if (!kind) return;
  if (kind === "try") document.getElementById("try-answer").textContent += msg.text;
  if (!msg.done) return;
  asks.delete(msg.request);
  const m = msg.measurement || {};
  document.getElementById(`${kind}-status`).textContent = msg.error ? `error: ${msg.error}` :
    kind === "try" ? `done: ${m.tokens} tokens, first after ${ms(m.ttft_s)}, ${num(m.tok_s_per_stream, 1)} tok/s` : "done";
  if (kind === "measure") addMeasurement(msg);
});

const tryForm = document.getElementById("try-form");
if (tryForm) {
  tryForm.addEventListener("submit", (ev) => {
    ev.preventDefault();
    document.getElementById("try-answer").textContent = "";
    ask("try", { prompt: tryForm.prompt.value, max_tokens: Number(tryForm.max_tokens.value) });
  });
  const measureForm = document.getElementById("measure-form");
  measureForm.addEventListener("submit", (ev) => {
    ev.preventDefault();
    ask("measure", { measure: true, streams: Number(measureForm.streams.value), max_tokens: Number(measureForm.max_tokens.value) });
  });
}
