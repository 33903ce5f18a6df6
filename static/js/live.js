// The browser's live feed: one websocket to /ws/fleet/, reconnecting with backoff, and the stale timer.
// The page tells the server what it shows (dashboard/subscriptions.py): the nodes of its [data-watch]
// elements, the heatmap if it has one, and a node the user points at (Live.watch); ticks carry only that.
// On a page with the heatmap (the fleet page) only the cards on screen (and about a screen around it) are
// watched, not every card of its page; the heatmap's messages name the nodes that reported, which keeps every
// card's status live, and a card that scrolls into view gets its node's current values at once.
"use strict";
// `var` and the guard: base.html loads this on every page and some pages load it again; one socket.
var Live = window.Live || (() => {
  const handlers = { update: [], heatmap: [], node: [], plan: [], alert: [], open: [], ask: [] };
  let socket = null;
  const lastSeen = new Map(); // node id -> browser clock ms of its last update
  const STALE_INTERVALS = 3;
  let retry = 500;
  let opens = 0; // how many times the socket has opened: above 1, the page missed updates meanwhile
  let isOpen = false;
  let lastOpen = -Infinity; // browser clock ms when an open socket last closed
  const RECENT_MS = 30000;

  function setStatus(text, ok) {
    const el = document.getElementById("live-status");
    if (el) { el.textContent = text; el.className = "live-status " + (ok ? "ok" : "down"); }
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}/ws/fleet/`);
    socket = ws;
    ws.onopen = () => {
      retry = 500; opens += 1; isOpen = true; setStatus("live", true);
      subscribed = null; subscribe(); // a new socket has no subscription
      handlers.open.forEach((h) => h(opens));
    };
    ws.onclose = () => {
      if (isOpen) lastOpen = Date.now();
      isOpen = false;
      setStatus("reconnecting…", false);
      // A server that answered moments ago is most likely restarting: try about twice a second, so that the
      // page is live again within a second of it (doubling, it was up to 4 s late after a 3 s restart).
      if (Date.now() - lastOpen < RECENT_MS) {
        setTimeout(connect, 250 + Math.random() * 500);
        return;
      }
      setTimeout(connect, retry + Math.random() * retry);
      retry = Math.min(retry * 2, 15000);
    };
    ws.onmessage = (ev) => dispatch(JSON.parse(ev.data));
  }

  const nodesSeen = new Set(); // every node whose values reached this page (the browser tests read it)
  window.layercakeNodesSeen = nodesSeen;
  let pointedAt = null; // a node the page shows for a moment (a heatmap hover), besides its own
  let onScreen = null; // the [data-watch] elements on screen, on a page with the heatmap (null: watch them all)
  let observed = null, resubscribe = null;
  function observeCards() {
    if (observed !== null || !("IntersectionObserver" in window)) return;
    onScreen = new Set();
    observed = new IntersectionObserver((entries) => {
      entries.forEach((e) => { if (e.isIntersecting) onScreen.add(e.target); else onScreen.delete(e.target); });
      clearTimeout(resubscribe); // a scroll moves many cards: one subscribe once it rests
      resubscribe = setTimeout(subscribe, 100);
    }, { rootMargin: "100% 0px" });
    document.querySelectorAll("[data-watch]").forEach((el) => observed.observe(el));
  }

  let subscribed = null; // what the server was last asked for (the same again is not sent)
  function subscribe() {
    const heatmap = document.getElementById("heatmap") !== null;
    if (heatmap) observeCards();
    const watched = onScreen === null ? document.querySelectorAll("[data-watch]") : onScreen;
    const nodes = [...new Set([...watched].map((el) => Number(el.dataset.watch)))].sort((a, b) => a - b);
    if (pointedAt !== null && !nodes.includes(pointedAt)) nodes.push(pointedAt);
    if (!isOpen || (!nodes.length && !heatmap)) return;
    const text = JSON.stringify({ type: "subscribe", ref: "subscribe", nodes, heatmap });
    if (text === subscribed) return;
    subscribed = text;
    socket.send(text);
  }

  function nodeStatus(msg) {
    if (msg.status === "online") lastSeen.set(String(msg.node), Date.now());
    markStatus(String(msg.node), msg.status);
    handlers.node.forEach((h) => h(msg));
  }

  function dispatch(msg) {
    if (msg.type === "fleet.update") {
      for (const n of msg.nodes) { lastSeen.set(String(n.node), Date.now()); markStatus(String(n.node), "online"); nodesSeen.add(n.node); }
      handlers.update.forEach((h) => h(msg));
    } else if (msg.type === "fleet.heatmap") {
      const now = Date.now();
      for (const n of msg.nodes) { lastSeen.set(String(n), now); markStatus(String(n), "online"); }
      handlers.heatmap.forEach((h) => h(msg));
    } else if (msg.type === "fleet.subscribed") {
      window.layercakeSubscribed = msg; // what the server now sends this page (the browser tests read it)
    } else if (msg.type === "fleet.refused" && msg.ref === "subscribe") {
      console.error("live updates: subscription refused:", msg.error);
    } else if (msg.type === "fleet.node") {
      nodeStatus(msg);
    } else if (msg.type === "fleet.nodes") { // many at once (the silent-node sweep): one message, not one each
      msg.nodes.forEach((n) => nodeStatus({ type: "fleet.node", ...n }));
    } else if (msg.type === "fleet.plan") {
      handlers.plan.forEach((h) => h(msg));
    } else if (msg.type === "fleet.alert") {
      handlers.alert.forEach((h) => h(msg));
    } else if (["fleet.asked", "fleet.answer", "fleet.refused"].includes(msg.type)) {
      handlers.ask.forEach((h) => h(msg));
    }
  }

  const LABELS = { online: "Online", stale: "Stale", offline: "Offline", new: "Never connected" };
  // The page's elements of each node, indexed once: a fleet tick names up to 1,000 nodes, and an attribute
  // query of the whole document per node per tick kept the main thread busy.
  let sections = null;
  function sectionsOf(nodeId) {
    if (sections === null) {
      sections = new Map();
      document.querySelectorAll("[data-node][data-status]").forEach((el) => {
        if (!sections.has(el.dataset.node)) sections.set(el.dataset.node, []);
        sections.get(el.dataset.node).push(el);
      });
    }
    return sections.get(nodeId) || [];
  }

  function markStatus(nodeId, status) {
    sectionsOf(nodeId).forEach((section) => {
      if (section.dataset.status === status) return;
      section.dataset.status = status;
      const badge = section.querySelector(".status");
      if (badge) { badge.textContent = LABELS[status] || status; badge.className = "status status-" + status; }
    });
  }

  function checkStale() {
    document.querySelectorAll("[data-node][data-interval]").forEach((section) => {
      const id = section.dataset.node;
      const seen = lastSeen.get(id);
      const limit = parseFloat(section.dataset.interval) * 1000 * STALE_INTERVALS;
      if (section.dataset.status === "online" && (seen === undefined ? pageLoaded : seen) + limit < Date.now()) {
        markStatus(id, "stale");
      }
    });
  }

  const pageLoaded = Date.now();
  connect();
  setInterval(checkStale, 500);
  return {
    onUpdate: (h) => handlers.update.push(h),
    onHeatmap: (h) => handlers.heatmap.push(h),
    // The page changed what it shows (its [data-watch] elements): tell the server.
    subscribe,
    // Also show this node for now (null: no longer): one at a time, as a hover shows one.
    watch: (nodeId) => { if (pointedAt !== nodeId) { pointedAt = nodeId; subscribe(); } },
    onNode: (h) => handlers.node.push(h),
    onPlan: (h) => handlers.plan.push(h),
    onAlert: (h) => handlers.alert.push(h),
    // Asks to a deployment's server ("Try it", "Measure"): sent on this socket, answered on it.
    onAsk: (h) => handlers.ask.push(h),
    send: (msg) => { if (!isOpen) return false; socket.send(JSON.stringify(msg)); return true; },
    // A page script registered after the socket opened is told at once, or it would miss that open.
    onOpen: (h) => { handlers.open.push(h); if (isOpen) h(opens); },
    // A GPU point by name: the server sends each point's values as a list and their names once per message
    // (dashboard.live.GpuPoint: util, mem_used, mem_total, temp, power, util_mem; a chart's history adds t first).
    point: (keys, values) => Object.fromEntries(keys.map((key, i) => [key, values[i]])),
  };
})();
