// Plans page: when the planning task reports, fetch the rendered plans once (no polling).
"use strict";
const plansBox = document.getElementById("plans");
function loadPlans() {
  fetch(plansBox.dataset.fragment, { credentials: "same-origin" })
    .then((r) => r.text())
    .then((html) => { plansBox.innerHTML = html; plansBox.dataset.status = "loaded"; });
}
Live.onPlan((msg) => { if (String(msg.request) === plansBox.dataset.request) loadPlans(); });
// The task may have finished between the page render and the websocket opening.
Live.onOpen(() => { if (["queued", "running"].includes(plansBox.dataset.status)) loadPlans(); });
