// The live dashboard: reads /dashboard/feed (server-sent events: one "hello", then a "tick" a few
// times a second with the engine's snapshot and the steps it has not sent yet) and draws it.
import { bindKeyField, drawLegend, errorMessage, headers, kindColour, ms, serverSentEvents } from "./common.js";

const $ = (id) => document.getElementById(id);
// The timeline spans the last 10 s of engine time, or as far back as its last 64 steps when they
// took longer (a loaded CPU or a large model: multi-second steps), up to 2 minutes.
const SPAN_S = 10, STEPS_SHOWN = 64, MAX_SPAN_S = 120;
const KEEP = 2048; // steps kept for drawing (the feed sends each once)
let steps = [];
let lastSeq = -1;
let feed = null; // the AbortController of the open feed

const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
const table = (obj) => Object.entries(obj)
  .map(([k, v]) => `<tr><td>${esc(k)}</td><td>${esc(v === null ? "off" : typeof v === "object" ? JSON.stringify(v) : v)}</td></tr>`)
  .join("");

// A fleet's feed (tailgate serve --replicas N) says which replicas run in its hello; its ticks
// carry a line per replica and tag each step with its replica, drawn on that replica's timeline.
let replicas = null;

function hello(h) {
  $("model-name").textContent = h.model;
  $("knobs").innerHTML = table(h.knobs);
  $("kernels").innerHTML = table(h.kernels);
  $("replicas-section").hidden = !h.replicas;
  $("timeline").toggleAttribute("hidden", !!h.replicas); // an <svg> has no `hidden` property
  layTimelines(h.replicas || null);
  if (replicas) { steps = []; lastSeq = -1; } // a fleet's step numbers are per replica
}

// One timeline per replica (a replaced replica gets its own when it first reports).
function layTimelines(ids) {
  replicas = ids;
  $("timelines").innerHTML = (ids || []).map((id) =>
    `<p class="muted">replica ${esc(id)}</p><svg class="timeline lane" data-replica="${esc(id)}" ` +
    `data-testid="step-timeline-replica" viewBox="0 0 1000 160" preserveAspectRatio="none"></svg>`).join("");
}

// Draws `shown` (steps of one engine, oldest first) on `svg` as of `now` (that engine's clock);
// returns the span drawn and the longest step in it.
function drawSteps(svg, shown, now) {
  const oldest = shown.length ? shown[Math.max(0, shown.length - STEPS_SHOWN)].at : now;
  const span = Math.min(MAX_SPAN_S, Math.max(SPAN_S, now - oldest));
  const visible = shown.filter((s) => s.at + s.duration_s >= now - span);
  const top = Math.max(0.02, ...visible.map((s) => s.duration_s)); // at least 20 ms tall
  const x = (t) => (1000 * (t - (now - span))) / span;
  svg.innerHTML = visible.map((s) => {
    const h = Math.max(2, (150 * s.duration_s) / top);
    const w = Math.max(1.5, x(s.at + s.duration_s) - x(s.at));
    const rows = `${s.decode_rows} decode + ${s.prompt_rows} prompt rows (${s.prompts} prompts)` +
      (s.preempted ? `, ${s.preempted} preempted` : "");
    return `<rect data-kind="${s.kind}" x="${x(s.at).toFixed(1)}" y="${(160 - h).toFixed(1)}" width="${w.toFixed(1)}" ` +
      `height="${h.toFixed(1)}" fill="${kindColour(s.kind)}"><title>step ${s.seq}: ${s.kind}, ${rows}, ` +
      `${(1000 * s.duration_s).toFixed(1)} ms</title></rect>`;
  }).join("");
  return { span, top };
}

function drawTimeline(t) {
  let drawn;
  if (replicas) {
    const nowOf = Object.fromEntries(t.replicas.map((r) => [r.id, r.now]));
    for (const svg of $("timelines").querySelectorAll("svg")) {
      const id = svg.dataset.replica;
      if (id in nowOf) drawn = drawSteps(svg, steps.filter((s) => s.replica === id), nowOf[id]);
    }
  } else {
    drawn = drawSteps($("timeline"), steps, t.now);
  }
  if (drawn) $("span").textContent = `${drawn.span.toFixed(0)} s`;
  const s = steps[steps.length - 1];
  if (s) {
    $("last-step").textContent = `Last step #${s.seq}${s.replica ? ` of replica ${s.replica}` : ""}: ${s.kind}, ` +
      `${s.decode_rows} decode + ${s.prompt_rows} prompt rows, ${(1000 * s.duration_s).toFixed(1)} ms` +
      (drawn ? ` (longest shown: ${(1000 * drawn.top).toFixed(1)} ms)` : "");
  }
}

const pct = (u) => `${(100 * u).toFixed(u < 0.01 ? 2 : 1)} %`;

function drawReplicas(rows) {
  $("replicas").innerHTML = "<tr><td>replica</td><td>running</td><td>waiting</td><td>held</td><td>KV in use</td>" +
    "<td>ITL p50 / p99, last min</td><td>steps</td></tr>" + rows.map((r) =>
    `<tr data-testid="replica-row"><td>${esc(r.id)}</td><td>${r.running}</td><td>${r.waiting}</td><td>${r.held}</td>` +
    `<td>${pct(r.kv_usage)}</td><td>${ms(r.itl.p50_s)} / ${ms(r.itl.p99_s)} (${r.itl.n})</td>` +
    `<td>${r.steps_total}${r.error ? ` · ${esc(r.error)}` : ""}</td></tr>`).join("");
}

function tick(t) {
  $("running").textContent = t.running;
  $("waiting").textContent = t.waiting;
  $("held").textContent = t.held;
  $("kv").textContent = pct(t.kv_usage);
  $("kv-pages").textContent = `${t.kv_pages_used} pages`;
  $("prefix").textContent = t.prefix_queries ? `${((100 * t.prefix_hits) / t.prefix_queries).toFixed(1)} %` : "–";
  $("prefix-tokens").textContent = `${t.prefix_hits} of ${t.prefix_queries} prompt tokens`;
  $("itl-p50").textContent = ms(t.itl.p50_s);
  $("itl-p99").textContent = ms(t.itl.p99_s);
  $("itl-n").textContent = `${t.itl.n} gaps`;
  if (t.socket_itl) {  // a single server's feed (the fleet's front reports the engines' gaps only)
    $("socket-p99").textContent = ms(t.socket_itl.p99_s);
    $("delivery-p99").textContent = `delivery p99 ${ms(t.delivery.p99_s)}`;
  }
  $("steps").textContent = `${t.steps_total} · ${t.preemptions}`;
  if (t.replicas) {
    drawReplicas(t.replicas);
    const ids = t.replicas.map((r) => r.id);
    if (ids.join() !== replicas.join()) layTimelines(ids);
  }
  if (t.steps.length) {
    steps = steps.concat(t.steps).slice(-KEEP * (replicas ? replicas.length : 1));
    if (!replicas) lastSeq = t.steps[t.steps.length - 1].seq;
  }
  drawTimeline(t);
}

async function connect() {
  feed?.abort();
  const ctl = (feed = new AbortController());
  $("feed-status").textContent = "connecting…";
  try {
    const resp = await fetch(`/dashboard/feed?since=${lastSeq}`, { headers: headers(), signal: ctl.signal });
    if (!resp.ok) {
      $("feed-status").textContent = await errorMessage(resp) + (resp.status === 401 ? " (enter the API key above)" : "");
      return; // a key change reconnects
    }
    $("feed-status").textContent = "live";
    for await (const { event, data } of serverSentEvents(resp)) {
      const obj = JSON.parse(data);
      if (event === "hello") hello(obj);
      else if (event === "tick") tick(obj);
      else if (event === "error") $("feed-status").textContent = obj.message;
    }
    $("feed-status").textContent = "the server closed the feed; reconnecting…";
  } catch (e) {
    if (ctl.signal.aborted) return;
    $("feed-status").textContent = `feed lost (${e.message || e}); reconnecting…`;
  }
  // The server restarted or the network dropped: try again, gently.
  setTimeout(() => { if (feed === ctl) connect(); }, 2000);
}

drawLegend($("legend"));
bindKeyField().addEventListener("change", connect);
connect();
