// Fleet page: refresh each GPU row from the live ticks.
"use strict";
function fmt(v, digits) { return v === null || v === undefined ? "–" : Number(v).toFixed(digits); }

function showDeployment(d) {
  const row = document.querySelector(`tr.deployment[data-deployment="${d.id}"]`);
  if (!row) return;
  const badge = row.querySelector(".state");
  badge.textContent = d.label; badge.className = "state state-" + d.state;
  row.querySelector(".tok").textContent = d.tokens_per_s === null ? "–" : Number(d.tokens_per_s).toFixed(1);
  row.querySelector(".running").textContent = d.running === null ? "–" : d.running;
}

Live.onUpdate((msg) => {
  (msg.deployments || []).forEach(showDeployment);
  for (const node of msg.nodes) {
    for (const [gpuId, p] of Object.entries(node.gpus)) {
      const row = document.querySelector(`tr.gpu[data-gpu="${gpuId}"]`);
      if (!row) continue;
      const { util, mem_used: used, mem_total: total, temp, power } = Live.point(msg.keys, p);
      row.querySelector(".util").textContent = `${fmt(util, 0)} %`;
      row.querySelector(".fill").style.width = `${total ? (100 * used) / total : 0}%`;
      row.querySelector(".mem").textContent = `${fmt(used, 0)} / ${fmt(total, 0)} MiB`;
      row.querySelector(".temp").textContent = `${fmt(temp, 0)} °C`;
      row.querySelector(".power").textContent = `${fmt(power, 0)} W`;
    }
  }
});
