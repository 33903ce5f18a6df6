// Alert banner on every page, kept current over the live feed: the server renders it, this swaps it in.
"use strict";
(() => {
  const holder = document.getElementById("alert-banner-holder");
  if (!holder || typeof Live === "undefined") return;
  const LABELS = { open: "Open", acknowledged: "Acknowledged", resolved: "Resolved" };

  function refresh() {
    fetch(holder.dataset.url, { credentials: "same-origin" })
      .then((r) => (r.ok ? r.text() : Promise.reject(new Error(`banner: HTTP ${r.status}`))))
      .then((html) => { holder.innerHTML = html; })
      .catch((err) => console.warn(err));
  }

  function updateDetail(alert) {
    const box = document.querySelector(`.alert-detail[data-alert="${alert.id}"]`);
    if (!box) return;
    const badge = document.getElementById("alert-status");
    badge.textContent = LABELS[alert.status] || alert.status;
    badge.className = "alert-status alert-" + alert.status;
    const ack = document.getElementById("acknowledge");
    if (ack && alert.status !== "open") ack.closest("form").remove();
  }

  Live.onAlert((msg) => { refresh(); updateDetail(msg.alert); });
  // After a reconnect the banner may be out of date: alerts changed while the socket was down.
  Live.onOpen((opens) => { if (opens > 1) refresh(); });
})();
