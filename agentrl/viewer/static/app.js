// agentrl view: the page. Plain JavaScript, no build step, nothing from the internet.
// Views are picked by the URL hash: #/curves, #/episodes?run=0&..., #/episode?run=0&key=...,
// #/group?run=0&kind=train&step=3&group_id=g0, #/task?run=0&task_id=17. The page polls
// /api/version every 2 s and redraws the current view when a run wrote something new.
"use strict";

const COLORS = ["#2b6cb0", "#dd6b20", "#38a169", "#805ad5", "#d53f8c", "#319795", "#b7791f", "#e53e3e"];
const DASHES = ["", "6 3", "2 3", "8 3 2 3"];
const CHARTS = [
  ["Reward", ["rollout/reward", "eval/reward", "eval/sampled_reward"]],
  ["Completion tokens", ["rollout/completion_tokens", "eval/completion_tokens"]],
  ["Entropy", ["train/entropy"]],
  ["Clip fraction", ["train/clip_frac"]],
  ["KL", ["train/kl", "train/approx_kl", "train/mismatch_kl"]],
  ["Staleness (versions)", ["train/staleness_mean", "train/staleness_max"]],
  ["Step time (s)", ["time/step", "time/rollout", "time/train", "time/sync"]],
  ["Turns", ["rollout/turns", "eval/turns"]],
  ["Loss", ["train/loss", "train/pg_loss"]],
  ["Gradient norm", ["train/grad_norm"]],
];
const PAGE = 50;
const SVGNS = "http://www.w3.org/2000/svg";

const state = { runs: [], shown: null, version: null, metrics: {}, episode: null };

// ------------------------------------------------------------------------------------------ helpers
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  return node;
}
function svg(tag, attrs) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}
const $ = (sel) => document.querySelector(sel);
function fmt(x, digits = 3) {
  if (x === null || x === undefined) return "–";
  if (typeof x !== "number") return String(x);
  if (Number.isInteger(x)) return String(x);
  return Math.abs(x) >= 1000 ? x.toFixed(0) : Number(x.toPrecision(digits)).toString();
}
async function api(path) {
  const r = await fetch(path);
  const body = await r.json().catch(() => ({ error: `${r.status} ${r.statusText}` }));
  if (!r.ok) throw new Error(body.error || `${r.status}`);
  return body;
}
function route() {
  const h = location.hash.replace(/^#\/?/, "") || "curves";
  const [name, query] = h.split("?");
  return { name, params: new URLSearchParams(query || "") };
}
function go(name, params) {
  const q = new URLSearchParams(params).toString();
  location.hash = `#/${name}${q ? "?" + q : ""}`;
}
function runColor(i) { return COLORS[i % COLORS.length]; }
function link(text, name, params, attrs) {
  const q = new URLSearchParams(params).toString();
  return el("a", { href: `#/${name}?${q}`, ...(attrs || {}), text });
}

// --------------------------------------------------------------------------------------- runs, live
async function loadRuns() {
  state.runs = await api("/api/runs");
  if (state.shown === null) state.shown = new Set(state.runs.map((r) => r.index));
  const box = $("#runs");
  box.replaceChildren();
  for (const run of state.runs) {
    const cb = el("input", { type: "checkbox", "data-run": run.index, checked: state.shown.has(run.index) });
    cb.addEventListener("change", () => {
      if (cb.checked) state.shown.add(run.index); else state.shown.delete(run.index);
      if (route().name === "curves") renderCurves();
    });
    box.append(el("label", { class: "run-chip", title: run.path, "data-run": run.index },
      cb, el("span", { class: "swatch", style: `background:${runColor(run.index)}` }),
      el("span", { text: run.name }), el("span", { class: "count", text: `${run.episodes} ep.` })));
  }
  const warn = $("#warnings");
  warn.replaceChildren();
  for (const run of state.runs)
    for (const w of run.warnings) {
      const line = el("div", { class: "warning", "data-run": run.index, title: "click to show it all", text: `${run.name}: ${w}` });
      line.addEventListener("click", () => line.classList.toggle("open"));
      warn.append(line);
    }
  const sel = $("#f-run");
  const current = sel.value;
  sel.replaceChildren(...state.runs.map((r) => el("option", { value: r.index, text: r.name })));
  if (current) sel.value = current;
}

async function poll() {
  try {
    const { version } = await api("/api/version");
    $("#live").classList.remove("stale");
    if (state.version !== null && version !== state.version) {
      state.version = version;
      await loadRuns();
      state.metrics = {};
      await render(true);
    }
    state.version = version;
    $("#live").dataset.version = version;
  } catch (e) {
    $("#live").classList.add("stale");
  }
}

// ------------------------------------------------------------------------------------------- curves
async function metricsOf(i) {
  if (!state.metrics[i]) state.metrics[i] = (await api(`/api/runs/${i}/metrics`)).rows;
  return state.metrics[i];
}

async function renderCurves() {
  const shown = state.runs.filter((r) => state.shown.has(r.index));
  const rows = {};
  for (const run of shown) rows[run.index] = await metricsOf(run.index);
  const box = $("#charts");
  box.replaceChildren();
  for (const [title, keys] of CHARTS) {
    const series = [];
    keys.forEach((key, k) => {
      for (const run of shown) {
        const pts = rows[run.index].filter((r) => typeof r[key] === "number").map((r) => [r.step, r[key]]);
        if (pts.length) series.push({ run, key, dash: DASHES[k % DASHES.length], pts });
      }
    });
    if (series.length) box.append(chart(title, series));
  }
  if (!box.children.length) box.append(el("p", { text: "No metrics yet: the runs shown have logged no step (metrics.jsonl)." }));
}

// Round values every `n`th of [lo, hi], and the number of decimals that tells them apart.
function ticks(lo, hi, n) {
  const span = hi - lo || 1;
  const step0 = Math.pow(10, Math.floor(Math.log10(span / n)));
  const step = [1, 2, 5, 10].map((m) => m * step0).find((s) => span / s <= n) || step0 * 10;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  out.decimals = Math.min(8, Math.max(0, Math.ceil(-Math.log10(step) - 1e-9)));
  return out;
}

function chart(title, series) {
  const W = 400, H = 200, L = 46, R = 10, T = 8, B = 24;
  const xs = series.flatMap((s) => s.pts.map((p) => p[0]));
  const ys = series.flatMap((s) => s.pts.map((p) => p[1]));
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
  const yt = ticks(y0, y1, 4);
  for (const v of yt) {
    s.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: sy(v), y2: sy(v) }));
    const t = svg("text", { x: L - 4, y: sy(v) + 3, "text-anchor": "end" });
    t.textContent = Math.abs(v) >= 1e5 || (v !== 0 && Math.abs(v) < 1e-4) ? v.toExponential(1) : v.toFixed(yt.decimals);
    s.append(t);
  }
  for (const v of ticks(x0, x1, 6).filter(Number.isInteger)) {  // steps are whole numbers
    const t = svg("text", { x: sx(v), y: H - B + 13, "text-anchor": "middle" }); t.textContent = fmt(v); s.append(t);
  }
  s.append(svg("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
  s.append(svg("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  const xl = svg("text", { x: W - R, y: H - 2, "text-anchor": "end" }); xl.textContent = "step"; s.append(xl);
  for (const se of series) {
    const color = runColor(se.run.index);
    const d = se.pts.map((p, i) => `${i ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
    s.append(svg("path", { class: "series", d, stroke: color, "stroke-dasharray": se.dash, "data-run": se.run.index, "data-key": se.key }));
    if (se.pts.length <= 60)
      for (const p of se.pts) {
        const c = svg("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.5, fill: color });
        const tt = svg("title", {}); tt.textContent = `${se.run.name} ${se.key} step ${p[0]}: ${fmt(p[1], 4)}`;
        c.append(tt); s.append(c);
      }
  }
  // the runs' colours are the chips' in the top bar; a chart's legend names its metrics by dash
  const legend = el("div", { class: "chart-legend" });
  const seen = new Set();
  for (const se of series) {
    if (seen.has(se.key)) continue;
    seen.add(se.key);
    const sample = svg("svg", { viewBox: "0 0 26 8" });
    sample.append(svg("line", { x1: 0, x2: 26, y1: 4, y2: 4, stroke: "#4a5568", "stroke-width": 2, "stroke-dasharray": se.dash }));
    legend.append(el("span", { "data-key": se.key }, sample, " " + se.key));
  }
  return el("div", { class: "chart", "data-title": title }, el("h3", { text: title }), s, legend);
}

// ----------------------------------------------------------------------------------- episode table
const FILTER_NAMES = ["kind", "step", "step_min", "step_max", "env", "task_id", "reward_min", "reward_max", "status", "fate", "turns", "q"];

function fillFilters(params) {
  $("#f-run").value = params.get("run") || "0";
  const run = state.runs[Number($("#f-run").value)];
  const env = $("#f-env");
  const chosen = params.get("env") || "";
  env.replaceChildren(el("option", { value: "", text: "any" }), ...((run && run.envs) || []).map((e) => el("option", { text: e })));
  for (const name of FILTER_NAMES) $(`#f-${name}`).value = params.get(name) || "";
  if (chosen && !(run && run.envs.includes(chosen))) env.append(el("option", { text: chosen }));
  env.value = chosen;
}

function filtersFromForm() {
  const p = { run: $("#f-run").value };
  for (const name of FILTER_NAMES) {
    const v = $(`#f-${name}`).value.trim();
    if (v) p[name] = v;
  }
  return p;
}

async function renderEpisodes(params) {
  fillFilters(params);
  const run = Number(params.get("run") || 0);
  const offset = Number(params.get("offset") || 0);
  const q = new URLSearchParams();
  for (const name of FILTER_NAMES) if (params.get(name)) q.set(name, params.get(name));
  q.set("offset", offset); q.set("limit", PAGE);
  const tbody = $("#ep-table tbody");
  $("#ep-error").textContent = "";
  let page;
  try {
    page = await api(`/api/runs/${run}/episodes?${q}`);
  } catch (e) {
    $("#ep-error").textContent = e.message;
    tbody.replaceChildren();
    $("#ep-total").textContent = "";
    $("#ep-total").dataset.total = "0";
    return;
  }
  const total = $("#ep-total");
  total.dataset.total = page.total;
  const stored = state.runs[run] ? state.runs[run].episodes : page.total;
  total.textContent = `${page.total} episode${page.total === 1 ? "" : "s"}` + (page.total !== stored ? ` of ${stored}` : "");
  $("#ep-range").textContent = page.total ? `${offset + 1}–${offset + page.episodes.length}` : "";
  $("#prev").disabled = offset <= 0;
  $("#next").disabled = offset + page.episodes.length >= page.total;
  $("#prev").onclick = () => go("episodes", { ...Object.fromEntries(params), offset: Math.max(0, offset - PAGE) });
  $("#next").onclick = () => go("episodes", { ...Object.fromEntries(params), offset: offset + PAGE });
  tbody.replaceChildren(...page.episodes.map((e) => episodeRow(run, e)));
}

function episodeRow(run, e) {
  const tr = el("tr", { class: "ep-row", "data-key": e.key, "data-reward": e.reward },
    el("td", { class: "num", text: e.step }), el("td", { text: e.kind }),
    el("td", {}, link(e.group_id, "group", { run, kind: e.kind, step: e.step, group_id: e.group_id }, { class: "group-link" })),
    el("td", { class: "num", text: e.episode_index }),
    el("td", {}, link(String(e.task_id), "task", { run, task_id: e.task_id }, { class: "task-link" })),
    el("td", { text: e.env }), el("td", { class: "num reward", text: fmt(e.reward) }),
    el("td", { class: "num", text: fmt(e.advantage) }),
    el("td", { class: `st-${e.status}`, text: e.status, title: e.error || "" }), el("td", { text: e.fate }),
    el("td", { class: "num", text: e.turns }), el("td", { class: "num", text: e.completion_tokens }),
    previewCell(e.error && !e.preview ? e.error : e.preview));
  tr.addEventListener("click", (ev) => {
    if (ev.target.closest("a")) return;
    go("episode", { run, key: e.key });
  });
  return tr;
}

// One line of a final answer; all of it on hover, and on the episode's page.
function previewCell(text) {
  return el("td", { class: "preview", title: text }, el("div", { text }));
}

// ------------------------------------------------------------------------------------- one episode
async function renderEpisode(params) {
  const run = Number(params.get("run") || 0);
  const key = params.get("key") || "";
  const head = $("#episode-head");
  head.replaceChildren(el("span", { text: "loading…" }));
  let e;
  try {
    e = await api(`/api/runs/${run}/episode?key=${encodeURIComponent(key)}`);
  } catch (err) {
    head.replaceChildren(el("span", { class: "error", text: err.message }));
    $("#episode-meta").replaceChildren(); $("#conversation").replaceChildren(); $("#tokens").replaceChildren();
    return;
  }
  state.episode = e;
  head.replaceChildren(
    el("strong", { id: "episode-key", text: e.key }),
    link("← episodes", "episodes", { run, step: e.step, kind: e.kind }),
    link(`group ${e.group_id}`, "group", { run, kind: e.kind, step: e.step, group_id: e.group_id }, { id: "to-group" }),
    link(`task ${e.task_id} across training`, "task", { run, task_id: e.task_id }, { id: "to-task" }));
  const meta = [["reward", fmt(e.reward, 4)], ["advantage", fmt(e.advantage, 4)], ["status", e.status], ["fate", e.fate],
    ["turns", e.turns], ["sampled tokens", e.completion_tokens], ["env", e.env], ["attempts", e.attempts],
    ["seconds", fmt(e.seconds)], ["trained version", fmt(e.trained_version)], ["finish", (e.finish_reasons || []).join(", ")],
    ["turn rewards", (e.turn_rewards || []).map((x) => fmt(x)).join(", ")]];
  if (e.error) meta.push(["error", e.error + (e.cause ? ` (${e.cause})` : "")]);
  $("#episode-meta").replaceChildren(...meta.map(([k, v]) =>
    el("div", { class: k === "error" ? "wide" : null }, el("dt", { text: k }), el("dd", { text: v, "data-field": k }))));
  renderConversation(e);
  setupColorBy(e);
  renderTokens();
}

function renderConversation(e) {
  const box = $("#conversation");
  box.replaceChildren();
  let msgs = null;
  try { msgs = e.messages ? JSON.parse(e.messages) : null; } catch (err) { msgs = null; }
  if (!Array.isArray(msgs)) {
    box.append(el("p", { class: "note", text: "No messages stored (an agent program's episode): the token stream by turn." }));
    const pieces = e.pieces || (e.token_ids || []).map(String);
    const starts = e.turn_starts || [], ends = e.turn_ends || [];
    let at = 0;
    starts.forEach((s, k) => {
      if (s > at) box.append(msgBox("context", pieces.slice(at, s).join("")));
      box.append(msgBox(`assistant (turn ${k + 1})`, pieces.slice(s, ends[k]).join(""), "assistant"));
      at = ends[k];
    });
    if (at < pieces.length) box.append(msgBox("context", pieces.slice(at).join("")));
    return;
  }
  for (const m of msgs) {
    const label = m.role === "tool" ? `tool${m.name ? " · " + m.name : ""}${m.tool_call_id ? " · " + m.tool_call_id : ""}` : m.role;
    const node = msgBox(label, m.content || "", m.role);
    if (m.reasoning_content) node.insertBefore(el("pre", { class: "reasoning", text: m.reasoning_content }), node.children[1]);
    for (const tc of m.tool_calls || []) {
      const fn = tc.function || {};
      node.append(el("pre", { class: "tool-call", text: `→ ${fn.name}(${fn.arguments})  [${tc.id}]` }));
    }
    box.append(node);
  }
}

function msgBox(label, text, role) {
  return el("div", { class: `msg role-${role || label}`, "data-role": role || label },
    el("div", { class: "role", text: label }), text ? el("pre", { class: "content", text }) : null);
}

// Per-token values: [values or null, scale kind]. Only sampled tokens (loss_mask 1) are coloured.
function tokenValues(e, by) {
  const n = (e.token_ids || []).length;
  if (by === "logprobs") return e.logprobs;
  if (by === "advantages") return e.advantages;
  if (by === "entropy") return e.entropy;
  if (by === "dlogp") return e.train_logprobs && e.logprobs ? e.train_logprobs.map((t, i) => (t === null || e.logprobs[i] === null ? null : t - e.logprobs[i])) : null;
  if (by === "staleness") return e.trained_version !== null && e.versions ? Array.from({ length: n }, (_, i) => e.trained_version - e.versions[i]) : null;
  return null;
}

function setupColorBy(e) {
  const sel = $("#color-by");
  let firstOk = null;
  for (const opt of sel.options) {
    opt.disabled = tokenValues(e, opt.value) === null;
    opt.title = opt.disabled ? "not stored for this episode (eval rows and rows the update did not see)" : "";
    if (!opt.disabled && firstOk === null) firstOk = opt.value;
  }
  if (sel.selectedOptions[0] && sel.selectedOptions[0].disabled) sel.value = firstOk || "logprobs";
}

function colorScale(by, vals) {
  const finite = vals.filter((v) => v !== null && Number.isFinite(v));
  if (by === "dlogp" || by === "advantages") {
    const m = Math.max(1e-9, ...finite.map(Math.abs));
    return { lo: -m, hi: m, grad: "linear-gradient(90deg,#3182ce,#fff,#e53e3e)",
      color: (v) => (v >= 0 ? `rgba(229,62,62,${(0.08 + 0.72 * v / m).toFixed(3)})` : `rgba(49,130,206,${(0.08 + 0.72 * -v / m).toFixed(3)})`) };
  }
  if (by === "logprobs") // probability of the sampled token: red where the policy was unsure
    return { lo: "p=0", hi: "p=1", grad: "linear-gradient(90deg,rgba(229,62,62,.85),rgba(229,62,62,.05))",
      color: (v) => `rgba(229,62,62,${(0.05 + 0.8 * (1 - Math.exp(v))).toFixed(3)})` };
  const m = Math.max(1e-9, ...finite);
  const rgb = by === "entropy" ? "128,90,213" : "221,107,32";
  return { lo: 0, hi: m, grad: `linear-gradient(90deg,rgba(${rgb},.05),rgba(${rgb},.85))`,
    color: (v) => `rgba(${rgb},${(0.05 + 0.8 * Math.max(0, v) / m).toFixed(3)})` };
}

function renderTokens() {
  const e = state.episode;
  if (!e) return;
  const by = $("#color-by").value;
  const raw = $("#raw-ids").checked;
  const box = $("#tokens");
  box.classList.toggle("raw", raw);
  const ids = e.token_ids || [], pieces = e.pieces || [], mask = e.loss_mask || [];
  const vals = tokenValues(e, by) || [];
  const sampledVals = vals.filter((_, i) => mask[i] === 1);
  const scale = colorScale(by, sampledVals);
  $("#scale").replaceChildren(el("span", { text: fmt(scale.lo) }), el("span", { class: "bar-grad", style: `background:${scale.grad}` }), el("span", { text: fmt(scale.hi) }));
  const starts = new Set(e.turn_starts || []);
  const frag = document.createDocumentFragment();
  for (let i = 0; i < ids.length; i++) {
    if (starts.has(i) && i > 0) frag.append(el("span", { class: "turn-sep" }));
    const text = raw ? String(ids[i]) + " " : (pieces[i] ?? "");
    if (mask[i] === 1) {
      const v = vals[i];
      const tip = [`#${i} id ${ids[i]}`, `logp ${fmt(e.logprobs && e.logprobs[i], 4)}`];
      if (e.train_logprobs) tip.push(`train logp ${fmt(e.train_logprobs[i], 4)}`);
      if (e.advantages) tip.push(`adv ${fmt(e.advantages[i], 4)}`);
      if (e.entropy) tip.push(`entropy ${fmt(e.entropy[i], 4)}`);
      if (e.versions) tip.push(`version ${e.versions[i]}`);
      frag.append(el("span", { class: "tok sampled", "data-i": i, "data-v": v ?? "", title: tip.join(" · "),
        style: v === null || v === undefined ? null : `background:${scale.color(v)}`, text }));
    } else {
      frag.append(el("span", { class: "tok ctx", "data-i": i, title: `#${i} id ${ids[i]} (context)`, text }));
    }
  }
  box.replaceChildren(frag);
}

// ------------------------------------------------------------------------------------ group, task
async function renderGroup(params) {
  const run = Number(params.get("run") || 0);
  const head = $("#group-head"), box = $("#group-eps");
  let g;
  try {
    g = await api(`/api/runs/${run}/group?${new URLSearchParams({ kind: params.get("kind") || "", step: params.get("step") || "", group_id: params.get("group_id") || "" })}`);
  } catch (err) {
    head.replaceChildren(el("span", { class: "error", text: err.message })); box.replaceChildren(); return;
  }
  const eps = g.episodes;
  const best = Math.max(...eps.map((e) => e.reward));
  const mean = eps.reduce((a, e) => a + e.reward, 0) / eps.length;
  head.replaceChildren(el("strong", { text: `group ${g.group_id} · ${g.kind} step ${g.step}` }),
    el("span", { text: `${eps.length} episodes · mean reward ${fmt(mean)}` }),
    link(`task ${eps[0].task_id} across training`, "task", { run, task_id: eps[0].task_id }),
    link("← episodes", "episodes", { run, kind: g.kind, step: g.step }));
  const lo = Math.min(0, ...eps.map((e) => e.reward)), hi = Math.max(1, best);
  box.replaceChildren(...eps.map((e) => el("div", { class: `group-ep${e.reward === best ? " best" : ""}`, "data-key": e.key, "data-reward": e.reward },
    el("div", { class: "bar" }, link(`#${e.episode_index}`, "episode", { run, key: e.key }), el("span", { class: `st-${e.status}`, text: e.status }), el("span", { text: e.fate })),
    el("div", { class: "nums" }, el("span", { text: `reward ${fmt(e.reward, 4)}` }), el("span", { class: "adv", text: `adv ${fmt(e.advantage, 4)}` })),
    el("div", { class: "reward-bar" }, el("span", { style: `width:${(100 * (e.reward - lo) / (hi - lo || 1)).toFixed(1)}%` })),
    el("pre", { class: "answer", text: e.answer || e.error || "" }))));
}

async function renderTask(params) {
  const run = Number(params.get("run") || 0);
  const head = $("#task-head"), tbody = $("#task-table tbody");
  let t;
  try {
    t = await api(`/api/runs/${run}/task/${encodeURIComponent(params.get("task_id") || "")}`);
  } catch (err) {
    head.replaceChildren(el("span", { class: "error", text: err.message })); tbody.replaceChildren(); return;
  }
  head.replaceChildren(el("strong", { text: `task ${t.task_id} across training` }),
    el("span", { text: `${t.episodes.length} episodes at ${t.steps.length} step(s)` }),
    link("← episodes", "episodes", { run, task_id: t.task_id }));
  let prev = null;
  tbody.replaceChildren(...t.episodes.map((e) => {
    const first = prev !== null && `${e.step}/${e.kind}` !== prev;  // a line between steps (and a step's eval)
    prev = `${e.step}/${e.kind}`;
    const tr = el("tr", { class: `task-ep${first ? " step-first" : ""}`, "data-key": e.key, "data-step": e.step, "data-kind": e.kind },
      el("td", { class: "num", text: e.step }), el("td", { text: e.kind }),
      el("td", {}, link(e.group_id, "group", { run, kind: e.kind, step: e.step, group_id: e.group_id })),
      el("td", { class: "num", text: e.episode_index }), el("td", { class: "num", text: fmt(e.reward) }),
      el("td", { class: "num", text: fmt(e.advantage) }), el("td", { class: `st-${e.status}`, text: e.status }),
      previewCell(e.answer || e.error || ""));
    tr.addEventListener("click", (ev) => { if (!ev.target.closest("a")) go("episode", { run, key: e.key }); });
    return tr;
  }));
}

// ------------------------------------------------------------------------------------------- router
async function render(live) {
  const { name, params } = route();
  const views = { curves: renderCurves, episodes: renderEpisodes, episode: renderEpisode, group: renderGroup, task: renderTask };
  const view = views[name] ? name : "curves";
  if (live && view === "episode") return; // a stored episode never changes
  for (const s of document.querySelectorAll(".view")) s.hidden = s.id !== `view-${view}`;
  for (const a of document.querySelectorAll("#top nav a")) a.classList.toggle("active", a.id === `nav-${view}`);
  await views[view](params);
  document.body.dataset.view = view;
  document.body.dataset.rendered = String(Number(document.body.dataset.rendered || 0) + 1);
}

async function main() {
  $("#filters").addEventListener("submit", (ev) => { ev.preventDefault(); go("episodes", filtersFromForm()); });
  $("#clear").addEventListener("click", () => go("episodes", { run: $("#f-run").value }));
  $("#f-run").addEventListener("change", () => go("episodes", { run: $("#f-run").value }));
  $("#color-by").addEventListener("change", renderTokens);
  $("#raw-ids").addEventListener("change", renderTokens);
  window.addEventListener("hashchange", () => render(false));
  await loadRuns();
  state.version = (await api("/api/version")).version;
  $("#live").dataset.version = state.version;
  await render(false);
  setInterval(poll, 2000);
}

main().catch((e) => { document.body.prepend(el("p", { class: "error", text: `agentrl view: ${e.message}` })); });
