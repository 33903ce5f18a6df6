// Alert detail page: the counters the rule saw around the onset (evidence.series), drawn once.
"use strict";
(() => {
  const series = JSON.parse(document.getElementById("evidence-series").textContent);
  const times = (series.t || []).map((s) => s * 1000);
  const palette = ["#111", "#e53935", "#1e88e5", "#43a047", "#fb8c00", "#8e24aa"];
  const names = Object.keys(series).filter((k) => k !== "t" && Array.isArray(series[k]));
  const datasets = names.map((name, i) => ({
    label: name.replaceAll("_", " "),
    data: times.map((x, j) => ({ x, y: series[name][j] })),
    yAxisID: name === "generation_tokens_total" ? "tokens" : "other",
    borderColor: palette[i % palette.length], borderWidth: i === 0 ? 2 : 1, pointRadius: 2, stepped: name !== "generation_tokens_total",
  }));
  new Chart(document.getElementById("evidence-chart"), {
    type: "line", data: { datasets },
    options: { animation: false, parsing: false, maintainAspectRatio: false,
      scales: { x: { type: "time" },
                tokens: { position: "left", title: { display: true, text: "generated tokens (total)" } },
                other: { position: "right", min: 0, title: { display: true, text: "requests" }, grid: { drawOnChartArea: false } } } },
  });
})();
