// The page of `sapo-node swarm`: its nodes side by side, from /swarm. Peers' text goes
// in as text only (charts.js).
"use strict";

(() => {
  const { el, fmt, shortPeer, chart, getJSON } = window.sapo;
  const $ = (id) => document.getElementById(id);
  const box = $("charts");
  const charts = {
    ma: chart(box, "swarm-reward", "Reward, moving average, per node", { min: 0 }),
    cumulative: chart(box, "swarm-cumulative", "Cumulative reward per node", { min: 0 }),
  };

  // Overlaid curves: one x axis, the union of the nodes' rounds.
  function overlay(nodes, key) {
    const xs = [...new Set(nodes.flatMap((n) => n.history.round))].sort((a, b) => a - b);
    const at = new Map(xs.map((x, i) => [x, i]));
    const series = nodes.map((n) => {
      const values = new Array(xs.length).fill(null);
      n.history.round.forEach((r, i) => { values[at.get(r)] = n.history[key][i]; });
      return { name: n.name, values, width: 2 };
    });
    return [xs, series];
  }

  function drawNodes(nodes) {
    $("nodes").tBodies[0].replaceChildren(...nodes.map((n) => {
      const r = n.last || {};
      const name = n.url ? el("a", { href: n.url + "/" }, n.name) : n.name;
      return el("tr", { "data-node": n.name },
        el("td", {}, name),
        el("td", { class: "peer", title: n.peer_id }, shortPeer(n.peer_id)),
        el("td", {}, n.state + (n.healthy === false ? " (unhealthy)" : "")),
        el("td", { class: "num" }, String(n.rounds)),
        el("td", { class: "num" }, fmt(r["reward/mean"], 3)),
        el("td", { class: "num" }, fmt(r["reward/cumulative"], 2)),
        el("td", { class: "num" }, r["net/peers"] === undefined ? "–" : String(r["net/peers"])),
        el("td", { class: "num" }, r["pool/groups"] === undefined ? "–" : String(r["pool/groups"])));
    }));
  }

  function drawMatrix(nodes, links) {
    const authors = [...nodes.map((n) => n.name), ...new Set(links.filter((l) => l.outside).map((l) => l.from))];
    const cell = new Map(links.map((l) => [l.to + "\u0000" + l.from, l]));
    $("matrix").tHead.replaceChildren(el("tr", {}, el("th", {}, "to \\ from"),
      ...authors.map((a) => el("th", { class: "num", title: a }, nodes.some((n) => n.name === a) ? a : shortPeer(a)))));
    $("matrix").tBodies[0].replaceChildren(...nodes.map((n) => el("tr", {},
      el("th", {}, n.name),
      ...authors.map((a) => {
        if (a === n.name) return el("td", { class: "num" }, "·");
        const l = cell.get(n.name + "\u0000" + a);
        if (!l) return el("td", { class: "num" }, "–");
        const title = Object.entries(l.outcomes).map(([k, v]) => `${k} ${v}`).join(", ");
        return el("td", { class: "num", title: title || null },
          `${l.accepted} / ${l.refused}`, l.distrusted ? el("span", { class: "tag bad" }, "distrusted") : null);
      }))));
  }

  async function poll() {
    try {
      const s = await getJSON("/swarm");
      $("stale").hidden = true;
      const running = s.nodes.filter((n) => n.state === "running").length;
      $("summary").textContent = `· ${s.nodes.length} nodes, ${running} running`;
      const bad = s.nodes.some((n) => n.healthy === false || n.state.startsWith("exited") || n.state.startsWith("killed"));
      $("health").textContent = bad ? "attention" : "ok";
      $("health").className = "badge " + (bad ? "bad" : "good");
      drawNodes(s.nodes);
      const window_ = s.nodes.length ? s.nodes[0].history.window : 10;
      charts.ma.box.querySelector("h3").textContent = `Reward, moving average (${window_} rounds), per node`;
      charts.ma.draw(...overlay(s.nodes, "reward_ma"));
      charts.cumulative.draw(...overlay(s.nodes, "reward/cumulative"));
      drawMatrix(s.nodes, s.links);
      $("about").textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      $("stale").hidden = false;
      $("stale").textContent = `The swarm does not answer (${err.message}); it may have stopped. Retrying.`;
      $("health").textContent = "no answer";
      $("health").className = "badge bad";
    } finally {
      setTimeout(poll, 3000);
    }
  }
  poll();
})();
