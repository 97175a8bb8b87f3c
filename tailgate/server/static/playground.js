// The chat playground: streams an answer from /v1/chat/completions or /v1/completions exactly as
// any OpenAI client would (stream: true), and draws what tailgate adds to each chunk: the kind of
// engine step that produced the token ("tailgate": {"cause", ...}).
import { bindKeyField, drawLegend, errorMessage, headers, kindColour, ms, serverSentEvents } from "./common.js";

const $ = (id) => document.getElementById(id);
const history = []; // chat turns sent so far: {role, content}
let inFlight = null; // the AbortController of the answer streaming now

function addTurn(role, text) {
  const div = document.createElement("div");
  div.className = `turn ${role}`;
  div.innerHTML = `<div class="who"></div><div class="text"></div>`;
  div.querySelector(".who").textContent = role;
  div.querySelector(".text").textContent = text;
  $("log").append(div);
  $("log").scrollTop = $("log").scrollHeight;
  return div;
}

function body(mode, prompt) {
  const b = { stream: true, stream_options: { include_usage: true }, max_tokens: Number($("max-tokens").value) || 16,
              temperature: Number($("temperature").value) };
  const seed = $("seed").value.trim();
  if (seed !== "") b.seed = Number(seed);
  const stop = $("stop-strings").value.split("\n").filter((s) => s !== "");
  if (stop.length) b.stop = stop;
  if ($("ignore-eos").checked) b.ignore_eos = true;
  const schema = $("json-schema").value.trim();
  if (schema) {
    try {
      b.response_format = { type: "json_schema", json_schema: { name: "playground", schema: JSON.parse(schema) } };
    } catch (e) {
      throw new Error(`the JSON schema box does not hold JSON: ${e.message}`);
    }
  }
  if (mode === "chat") {
    const system = $("system").value.trim();
    b.messages = [...(system ? [{ role: "system", content: system }] : []), ...history, { role: "user", content: prompt }];
  } else {
    b.prompt = prompt;
  }
  return b;
}

/** The gap strip: one bar per token after the first, height = its gap, colour = its step kind. */
function drawStrip(svg, gaps) {
  const top = Math.max(0.05, ...gaps.map((g) => g.gap)); // at least 50 ms tall: small gaps stay small
  const w = Math.max(1, Math.min(8, 600 / Math.max(1, gaps.length))); // 8 units a bar until 75 tokens, then narrower
  svg.setAttribute("viewBox", `0 0 ${Math.max(600, gaps.length * w)} 28`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.innerHTML = gaps.map((g, i) => {
    const h = Math.max(1, (28 * g.gap) / top);
    return `<rect x="${i * w}" y="${28 - h}" width="${w * 0.8}" height="${h}" fill="${kindColour(g.cause)}">` +
      `<title>token ${i + 2}: ${(1000 * g.gap).toFixed(1)} ms after the previous, ${g.cause || "?"} step</title></rect>`;
  }).join("");
}

async function send() {
  const prompt = $("prompt").value;
  const mode = $("mode").value;
  if (!prompt.trim() || inFlight) return;
  $("error").textContent = "";
  let request;
  try {
    request = body(mode, prompt);
  } catch (e) {
    $("error").textContent = e.message;
    return;
  }
  addTurn("user", prompt);
  $("prompt").value = "";
  for (const id of ["reply", "reply-stats", "gap-strip"]) { // these name the latest answer's parts only
    document.querySelector(`[data-testid="${id}"]`)?.removeAttribute("data-testid");
  }
  const turn = addTurn("assistant", "");
  const text = turn.querySelector(".text");
  text.setAttribute("data-testid", "reply");
  const stats = Object.assign(document.createElement("div"), { className: "stats" });
  stats.setAttribute("data-testid", "reply-stats");
  const strip = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  strip.setAttribute("class", "strip");
  strip.setAttribute("data-testid", "gap-strip");
  turn.append(stats, strip);

  const ctl = (inFlight = new AbortController());
  $("send").disabled = true;
  $("stop").disabled = false;
  $("status").textContent = "waiting for the first token…";
  const sent = performance.now();
  let first = null, last = null, tokens = 0, usage = null, finish = null, answer = "";
  const gaps = [];
  let failed = false;
  const show = () => {
    const rate = tokens > 1 && last > first ? ((tokens - 1) * 1000) / (last - first) : null;
    stats.textContent = `TTFT ${first == null ? "–" : ms((first - sent) / 1000)} · ${tokens} tokens` +
      (rate ? ` · ${rate.toFixed(1)} tok/s` : "") + (usage ? ` · prompt ${usage.prompt_tokens} tokens` : "") +
      (finish ? ` · finish: ${finish}` : "");
  };
  try {
    const path = mode === "chat" ? "/v1/chat/completions" : "/v1/completions";
    const resp = await fetch(path, { method: "POST", headers: headers(true), body: JSON.stringify(request), signal: ctl.signal });
    if (!resp.ok) throw new Error(await errorMessage(resp));
    for await (const { data } of serverSentEvents(resp)) {
      if (data === "[DONE]") break;
      const obj = JSON.parse(data);
      if (obj.error) throw new Error(obj.error.message);
      if (obj.usage) usage = obj.usage;
      const choice = obj.choices && obj.choices[0];
      if (!choice) continue;
      const piece = mode === "chat" ? (choice.delta && choice.delta.content) || "" : choice.text || "";
      if (choice.finish_reason) finish = choice.finish_reason;
      if (!obj.tailgate) { // the chat stream's opening role chunk, or a finish without a token
        if (piece) { answer += piece; text.textContent = answer; }
        continue;
      }
      const now = performance.now();
      if (first == null) first = now;
      else gaps.push({ gap: (now - last) / 1000, cause: obj.tailgate.cause });
      last = now;
      tokens += 1;
      answer += piece;
      text.textContent = answer;
      drawStrip(strip, gaps);
      show();
      $("status").textContent = "streaming…";
    }
    if (usage) tokens = usage.completion_tokens;
    $("status").textContent = "";
  } catch (e) {
    if (e.name === "AbortError") {
      finish = "stopped here (the server cancelled the request)";
      $("status").textContent = "stopped";
    } else {
      failed = true;
      $("error").textContent = String(e.message || e);
      $("status").textContent = "";
    }
  } finally {
    inFlight = null;
    show();
    $("send").disabled = false;
    $("stop").disabled = true;
    if (mode === "chat" && !failed) history.push({ role: "user", content: prompt }, { role: "assistant", content: answer });
  }
}

async function modelName() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    if (r.ok) $("model-name").textContent = (await r.json()).data[0].id;
    else $("model-name").textContent = r.status === 401 ? "(enter the API key)" : "";
  } catch { /* the name is a nicety */ }
}

// What the model is good for (/version's model card): a base model (no chat template of its own)
// continues text, so the page opens in completion mode and says why; the mode stays the user's.
let modeChosen = false;
async function modelCard() {
  try {
    const r = await fetch("/version");
    const card = r.ok ? (await r.json()).model : null;
    if (!card) return void setTimeout(modelCard, 1000); // still loading
    $("model-note").textContent = card.note;
    if (card.base && !modeChosen) {
      $("mode").value = "completion";
      $("system-field").hidden = true;
      $("prompt").placeholder = "Text for the model to continue, then Send (Ctrl+Enter)";
    }
  } catch { /* the note is a nicety */ }
}

bindKeyField().addEventListener("change", modelName);
drawLegend($("legend"));
modelName();
modelCard();
$("mode").addEventListener("change", () => { modeChosen = true; $("system-field").hidden = $("mode").value !== "chat"; });
$("send").addEventListener("click", send);
$("stop").addEventListener("click", () => inFlight && inFlight.abort());
$("clear").addEventListener("click", () => { history.length = 0; $("log").innerHTML = ""; $("error").textContent = ""; });
$("prompt").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) send(); });
