// Hand-written SVG line charts and DOM helpers for sapo-node's pages. No library, no
// request anywhere but the node. Everything a peer may have written (peer IDs, refusal
// details) enters the page through textContent, never as markup.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#3b82f6", "#f97316", "#16a34a", "#a855f7", "#e11d48", "#0891b2", "#ca8a04", "#64748b"];

// An element with attributes and children; strings become text nodes.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

function fmt(v, digits) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (digits !== undefined) return Number(v).toFixed(digits);
  const a = Math.abs(v);
  if (a >= 1e9) return (v / 1e9).toFixed(1) + "G";
  if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (a >= 1e4) return (v / 1e3).toFixed(1) + "k";
  if (a >= 100) return v.toFixed(0);
  if (a >= 10) return v.toFixed(1);
  if (a >= 1) return v.toFixed(2);
  return v.toFixed(3);
}

function duration(s) {
  if (s === null || s === undefined) return "–";
  s = Math.max(0, Math.floor(s));
  if (s < 120) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min";
  if (s < 86400) return Math.floor(s / 3600) + " h " + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + " min";
  return Math.floor(s / 86400) + " d " + String(Math.floor((s % 86400) / 3600)).padStart(2, "0") + " h";
}

function shortPeer(id) {
  id = String(id);
  return id.length > 14 ? "…" + id.slice(-10) : id;
}

// A card of key figures: [[label, value, small print], ...].
function facts(container, items) {
  container.replaceChildren(
    ...items.map(([k, v, s]) => el("div", { class: "fact" }, el("div", { class: "k" }, k),
      el("div", { class: "v" }, v), s ? el("div", { class: "s" }, s) : null)));
}

// A chart box, made once and redrawn in place: {box, draw(x, series, opts)}.
// series: [{name, values, color?, width?, dash?, dots?}], aligned with x (null: a gap).
// The svg carries data-points (how many x values it draws) for tests and for people.
function chart(container, id, title, opts) {
  opts = opts || {};
  const box = el("div", { class: "chart", id: "chart-" + id });
  const legend = el("div", { class: "legend" });
  const readout = el("div", { class: "readout" });
  const W = 400, H = opts.height || 170, L = 44, R = 14, T = 6, B = 20;
  const plot = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title, "data-chart": id, "data-points": 0 });
  box.append(el("h3", {}, title), legend, plot, readout);
  container.append(box);
  let last = null;

  function draw(x, series, o) {
    o = Object.assign({}, opts, o || {});
    last = { x, series, o };
    plot.replaceChildren();
    plot.setAttribute("data-points", x.length);
    legend.replaceChildren(...series.filter((s) => !s.hidden).map((s, i) =>
      el("span", {}, colourSwatch(s.color || PALETTE[i % PALETTE.length]), s.name)));
    if (!x.length) {
      const t = svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" });
      t.textContent = o.empty || "no rounds yet";
      plot.append(t);
      return;
    }
    let x0 = Math.min(...x), x1 = Math.max(...x);
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    const ys = series.flatMap((s) => s.values).filter((v) => v !== null && v !== undefined && Number.isFinite(v));
    let y0 = o.min !== undefined ? o.min : Math.min(0, ...ys);
    let y1 = o.max !== undefined ? Math.max(o.max, ...ys) : Math.max(...ys, y0);
    if (!ys.length) { y0 = 0; y1 = 1; }
    if (y1 - y0 < 1e-6) y1 = y0 + 1;  // a flat line: a unit of room above it
    const sx = (v) => L + ((v - x0) / (x1 - x0)) * (W - L - R);
    const sy = (v) => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
    for (let i = 0; i <= 4; i++) {
      const v = y0 + ((y1 - y0) * i) / 4, y = sy(v);
      plot.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: y, y2: y }));
      const t = svg("text", { x: L - 4, y: y + 3, "text-anchor": "end" });
      t.textContent = (o.yfmt || fmt)(v);
      plot.append(t);
    }
    for (const v of [x0, (x0 + x1) / 2, x1]) {
      const t = svg("text", { x: sx(v), y: H - 6, "text-anchor": "middle" });
      t.textContent = o.xfmt ? o.xfmt(v) : String(Math.round(v));
      plot.append(t);
    }
    series.forEach((s, i) => {
      if (s.hidden) return;
      const colour = s.color || PALETTE[i % PALETTE.length];
      let d = "", pen = false;
      s.values.forEach((v, j) => {
        if (v === null || v === undefined || !Number.isFinite(v)) { pen = false; return; }
        const px = sx(x[j]).toFixed(1), py = sy(v).toFixed(1);
        if (o.step && pen) d += `H${px}V${py}`; else d += (pen ? "L" : "M") + px + " " + py;
        pen = true;
      });
      plot.append(svg("path", { d, fill: "none", stroke: colour, "stroke-width": s.width || 1.5,
        "stroke-dasharray": s.dash || "none", "stroke-linejoin": "round", "data-series": s.name, opacity: s.opacity || 1 }));
      if (s.dots || x.length === 1) {
        s.values.forEach((v, j) => {
          if (v === null || v === undefined) return;
          plot.append(svg("circle", { cx: sx(x[j]), cy: sy(v), r: 2.2, fill: colour }));
        });
      }
    });
    const cursor = svg("line", { class: "cursor", y1: T, y2: H - B, x1: -10, x2: -10 });
    plot.append(cursor);
    plot.onpointermove = (ev) => {
      const rect = plot.getBoundingClientRect();
      const vx = ((ev.clientX - rect.left) / rect.width) * W;
      const want = x0 + ((vx - L) / (W - L - R)) * (x1 - x0);
      let j = 0;
      for (let k = 1; k < x.length; k++) if (Math.abs(x[k] - want) < Math.abs(x[j] - want)) j = k;
      cursor.setAttribute("x1", sx(x[j])); cursor.setAttribute("x2", sx(x[j]));
      readout.textContent = `${o.xname || "round"} ${o.xfmt ? o.xfmt(x[j]) : x[j]}: ` +
        series.filter((s) => !s.hidden).map((s) => `${s.name} ${(o.yfmt || fmt)(s.values[j])}`).join(", ");
    };
    plot.onpointerleave = () => { readout.textContent = ""; cursor.setAttribute("x1", -10); cursor.setAttribute("x2", -10); };
  }
  return { box, draw, get last() { return last; } };
}

function colourSwatch(colour) {
  const i = el("i");
  i.style.background = colour;
  return i;
}

async function getJSON(path) {
  const answer = await fetch(path, { cache: "no-store" });
  if (!answer.ok) throw new Error(`${path}: HTTP ${answer.status}`);
  return answer.json();
}

window.sapo = { el, svg, fmt, duration, shortPeer, facts, chart, getJSON, PALETTE };
