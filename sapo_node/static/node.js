// The live page of one node (or relay): polls /status, draws /history (its whole run, from
// metrics.jsonl) when a round has passed. Peers' text goes in as text only (charts.js).
"use strict";

(() => {
  const { el, fmt, duration, shortPeer, facts, chart, getJSON } = window.sapo;
  const POLL_MS = 2000;
  // Outcomes that are no refusal: pooled groups that left, completions the checks looked at.
  const NEUTRAL = (k) => k.startsWith("evicted") || k === "expired" || k === "completions_checked";
  const $ = (id) => document.getElementById(id);
  let charts = null, netChart = null, shownRound = null, lastOk = Date.now();
  const netSamples = { t: [], peers: [], inRate: [], outRate: [] }; // a relay's view, since the page opened
  let prevNet = null;

  function makeCharts() {
    const box = $("node-charts");
    return {
      reward: chart(box, "reward", "Reward per round (own completions)", { min: 0 }),
      cumulative: chart(box, "cumulative", "Cumulative reward", { min: 0 }),
      eval: chart(box, "eval", "Held-out accuracy (at each evaluation)", { min: 0, max: 1, empty: "no evaluation yet" }),
      format: chart(box, "format", "Answer-format rate (answer tags)", { min: 0, max: 1 }),
      levels: chart(box, "levels", "Curriculum level per family", { min: 0, step: true }),
      time: chart(box, "time", "Seconds per round, by phase", { min: 0 }),
      speed: chart(box, "speed", "Generation speed (tokens/s)", { min: 0 }),
      memory: chart(box, "memory", "Memory (peak, MiB)", { min: 0 }),
      swarm: chart(box, "swarm", "Swarm per round: peers and peers' groups", { min: 0 }),
      pool: chart(box, "pool", "Pool size (groups)", { min: 0 }),
      age: chart(box, "age", "Age of the peers' groups trained on (s)", { min: 0 }),
    };
  }

  function byPrefix(series, prefix) {
    return Object.keys(series).filter((k) => k.startsWith(prefix)).sort()
      .map((k) => ({ name: k.slice(prefix.length).replace(/^.*[:.]/, ""), values: series[k] }));
  }

  function drawHistory(h) {
    const x = h.round, s = h.series;
    const kind = (c) => c.box.querySelector("svg").setAttribute("data-kind", "round");
    Object.entries(charts).forEach(([k, c]) => { if (k !== "eval") kind(c); });
    charts.reward.draw(x, [
      { name: "round", values: s["reward/mean"], width: 1, opacity: 0.55 },
      { name: `moving average (${h.window})`, values: s.reward_ma, width: 2.5 },
      { name: "peers' groups (scored here)", values: s["reward/external_mean"], width: 1, dash: "3 3" },
    ]);
    charts.cumulative.draw(x, [{ name: "cumulative reward", values: s["reward/cumulative"], width: 2 }]);
    const e = h.eval;
    charts.eval.draw(e.round, [
      { name: "pass@1", values: e.pass1, width: 2, dots: true },
      { name: "greedy", values: e.greedy, width: 2, dots: true },
    ]);
    charts.eval.box.querySelector("svg").setAttribute("data-kind", "eval");
    charts.format.draw(x, [{ name: "answer tags", values: s["rollout/answer_tag_rate"] }]);
    charts.levels.draw(x, byPrefix(s, "family_level/"));
    const phases = ["generate", "score", "screen", "train", "eval"].filter((p) => `phase_s/${p}` in s);
    charts.time.draw(x, [
      ...phases.map((p) => ({ name: p, values: s[`phase_s/${p}`] })),
      { name: "round", values: s["phase_s/round"], width: 1, dash: "4 3", color: "#888" },
    ]);
    charts.speed.draw(x, [{ name: "tokens/s", values: s["rollout/tokens_per_s"] }]);
    charts.memory.draw(x, [
      { name: "peak RSS", values: s["memory/peak_rss_mb"] },
      { name: "peak GPU", values: s["memory/peak_gpu_mb"] },
    ]);
    charts.swarm.draw(x, [
      { name: "peers", values: s["net/peers"], width: 2 },
      { name: "received", values: s["net/received"] },
      { name: "accepted", values: s["net/accepted"] },
      { name: "refused", values: s["net/rejected"], color: "#e11d48" },
      { name: "trained on", values: s["groups/external"], dash: "3 3" },
    ]);
    charts.pool.draw(x, [{ name: "groups in the pool", values: s["pool/groups"] }]);
    charts.age.draw(x, [{ name: "mean age (s)", values: s["groups/external_age_s"] }]);
    const thinned = h.shown < h.rounds ? ` (${h.shown} of ${h.rounds} rounds drawn, evenly spaced)` : "";
    $("about").dataset.rounds = h.rounds;
    aboutHistory = `${h.rounds} rounds in metrics.jsonl${thinned}`;
  }
  let aboutHistory = "";

  function nodeFacts(f) {
    const r = f.last_round, e = f.last_eval;
    const levels = r ? Object.entries(r).filter(([k]) => k.startsWith("family_level/"))
      .map(([k, v]) => `${k.slice("family_level/".length).replace(/^.*[:.]/, "")} ${v}`).join(", ") : "";
    return [
      ["rounds done", String(f.round), `now: ${f.phase}`],
      ["last round", r ? duration(r.ago_s) + " ago" : "none yet", r ? `took ${fmt(r["phase_s/round"], 1)} s` : ""],
      ["reward", r ? fmt(r["reward/mean"], 3) : "–", "last round, own completions"],
      ["cumulative reward", fmt(f.cumulative_reward, 2), ""],
      ["held-out", e ? `${fmt(e.pass1, 3)} / ${fmt(e.greedy, 3)}` : "–", e ? `pass@1 / greedy, round ${e.round}` : "no evaluation yet"],
      ["answer format", r ? fmt(r["rollout/answer_tag_rate"], 2) : "–", levels ? "levels: " + levels : ""],
      ["generation", r ? fmt(r["rollout/tokens_per_s"]) + " tok/s" : "–", r ? `gen ${fmt(r["phase_s/generate"], 1)} · score ${fmt(r["phase_s/score"], 1)} · train ${fmt(r["phase_s/train"], 1)} s` : ""],
      ["pool", `${f.pool.groups} groups`, `${fmt(f.pool.mb, 1)} MiB` + (r && r["groups/external_age_s"] !== undefined ? ` · trained on ${fmt(r["groups/external_age_s"], 1)} s old` : "")],
    ];
  }

  function commonFacts(f) {
    const n = f.net;
    return [
      ["peers", n ? String(n.peers) : "offline", n ? `${n.restarts} network restarts` : ""],
      ["memory", fmt(f.rss_mb) + " MiB", "resident now"],
      ["up", duration(f.uptime_s), `pid ${f.pid}`],
    ];
  }

  function drawNet(f) {
    const n = f.net;
    if (!n) { $("net").replaceChildren(el("p", {}, "The network is off: this node trains alone.")); return; }
    facts($("net"), [
      ["published", String(n.published), `${n.publish_dropped} unsent (queue full)`],
      ["received", String(n.received), `${n.rejected} refused by the network's checks`],
      ["inbox dropped", String(n.inbox_dropped), "the round loop was busy"],
      ["traffic", `${fmt(n.bytes_in / 1048576, 1)} / ${fmt(n.bytes_out / 1048576, 1)} MiB`, "in / out"],
      ["reachability", n.reachability ? n.reachability + (n.reachability_reason ? ` (${n.reachability_reason})` : "") : "starting", `connections ${n.connections_direct} direct, ${n.connections_relayed} relayed; DHT table ${n.routing_table}` + (n.autonat ? `; peers' dial-backs: ${n.autonat}` : "")],
    ]);
  }

  function drawPeers(f) {
    const body = $("peers").tBodies[0];
    const rows = (f.authors || []).map((a) => {
      const tags = Object.entries(a.outcomes).map(([k, v]) =>
        el("span", { class: "tag" + (NEUTRAL(k) ? "" : " bad") }, `${k} ${v}`));
      if (a.distrusted) tags.unshift(el("span", { class: "tag bad" }, "distrusted"));
      return el("tr", { class: a.distrusted ? "distrusted" : null, "data-peer": a.peer },
        el("td", { class: "peer", title: a.peer }, shortPeer(a.peer)),
        el("td", { class: "num" }, String(a.accepted)),
        el("td", {}, tags.length ? tags : "–"));
    });
    if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 3 }, f.role === "relay" ? "A relay pools nothing: it forwards." : "No peer's group yet.")));
    body.replaceChildren(...rows);
    const rbody = $("refusals").tBodies[0];
    const refusals = (f.recent_refusals || []).map((r) => el("tr", {},
      el("td", {}, new Date(r.time * 1000).toLocaleTimeString()),
      el("td", { class: "peer", title: r.peer }, shortPeer(r.peer)),
      el("td", {}, `${r.reason} (${r.outcome})`),
      el("td", { class: "detail" }, r.detail || "")));
    if (!refusals.length) refusals.push(el("tr", {}, el("td", { colspan: 4 }, "None.")));
    rbody.replaceChildren(...refusals);
  }

  function drawRelay(f) {
    const n = f.net;
    if (!n) return;
    const t = Date.now() / 1000;
    if (prevNet) {
      const dt = Math.max(1e-3, t - prevNet.t);
      netSamples.t.push(t);
      netSamples.peers.push(n.peers);
      netSamples.inRate.push((n.bytes_in - prevNet.bytes_in) / 1024 / dt);
      netSamples.outRate.push((n.bytes_out - prevNet.bytes_out) / 1024 / dt);
      if (netSamples.t.length > 2000) Object.values(netSamples).forEach((a) => a.shift());
    }
    prevNet = { t, bytes_in: n.bytes_in, bytes_out: n.bytes_out };
    if (!netChart) {
      const box = $("net-charts");
      netChart = {
        peers: chart(box, "relay-peers", "Peers (since this page opened)", { min: 0, xname: "time", xfmt: clock, empty: "collecting…" }),
        traffic: chart(box, "relay-traffic", "Traffic (KiB/s)", { min: 0, xname: "time", xfmt: clock, empty: "collecting…" }),
      };
    }
    netChart.peers.draw(netSamples.t, [{ name: "peers", values: netSamples.peers, width: 2 }]);
    netChart.traffic.draw(netSamples.t, [
      { name: "in", values: netSamples.inRate }, { name: "out", values: netSamples.outRate },
    ]);
  }

  function clock(t) {
    return new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  }

  function drawHealth(f) {
    const badge = $("health");
    badge.textContent = f.healthy ? "healthy" : "unhealthy";
    badge.className = "badge " + (f.healthy ? "good" : "bad");
    const p = $("problems");
    p.hidden = f.healthy;
    p.textContent = f.healthy ? "" : f.problems.join("; ");
  }

  async function poll() {
    try {
      const f = await getJSON("/status");
      lastOk = Date.now();
      $("stale").hidden = true;
      $("role").textContent = f.role === "node" ? `· ${f.model} on ${f.device}${f.lora ? " (LoRA)" : ""}` : "· relay (--no-train)";
      document.title = `sapo-node ${f.role === "node" ? "r" + f.round : "relay"} ${f.healthy ? "" : "(unhealthy)"}`;
      drawHealth(f);
      facts($("facts"), [...(f.role === "node" ? nodeFacts(f) : []), ...commonFacts(f)]);
      drawNet(f);
      drawPeers(f);
      if (f.role === "node") {
        if (!charts) charts = makeCharts();
        if (f.round !== shownRound) {
          drawHistory(await getJSON("/history"));
          shownRound = f.round;
        }
      } else {
        drawRelay(f);
      }
      $("about").textContent = `sapo-node ${f.version} · peer ID ${f.peer_id || "(offline)"} · data ${f.data_dir}` +
        (aboutHistory ? ` · ${aboutHistory}` : "") + ` · updated ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      const s = $("stale");
      s.hidden = false;
      s.textContent = `The node does not answer (${err.message}); last answer ${duration((Date.now() - lastOk) / 1000)} ago. Retrying.`;
      $("health").textContent = "no answer";
      $("health").className = "badge bad";
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  poll();
})();
