// What both pages share: the API key field, request headers, the server-sent-events reader
// (fetch + ReadableStream: EventSource cannot send the Authorization header) and the colours of
// the step kinds (the engine's names: tailgate/engine/plan.py StepRecord.kind, Token.cause).

export const KIND_COLOURS = {
  decode: "#5b8def",     // a plain decode round: the gap a stream cannot avoid
  mixed: "#f29d38",      // prompts gathered into the live batch in one step
  walk: "#e5c620",       // one round of a prompt walked in by chunks
  prefill: "#a06cd5",    // a prompt prefilled with no live rows
  recompute: "#e0464e",  // a preempted request's prompt run again
  lane: "#3bb273",       // a side-lane prefill joining the batch
};
export const kindColour = (kind) => KIND_COLOURS[kind] || "#999";

export function drawLegend(el) {
  el.innerHTML = Object.entries(KIND_COLOURS).map(([k, c]) => `<span><i style="background:${c}"></i>${k}</span>`).join("");
}

const KEY = "tailgate-api-key";

/** Wire the page's key field to localStorage, so the key typed on one page serves the other. */
export function bindKeyField() {
  const field = document.getElementById("api-key");
  field.value = localStorage.getItem(KEY) || "";
  field.addEventListener("change", () => localStorage.setItem(KEY, field.value.trim()));
  return field;
}

export function headers(json = false) {
  const h = {};
  const key = (document.getElementById("api-key")?.value || "").trim();
  if (key) h["Authorization"] = `Bearer ${key}`;
  if (json) h["Content-Type"] = "application/json";
  return h;
}

/** The message of an OpenAI error body, or the status line when the body is not one. */
export async function errorMessage(resp) {
  const text = await resp.text();
  try {
    return `${resp.status}: ${JSON.parse(text).error.message}`;
  } catch {
    return `${resp.status} ${resp.statusText}: ${text.slice(0, 200)}`;
  }
}

/** Yield {event, data} for each server-sent event of a fetch Response as its bytes arrive
 *  ("message" when the event has no name; data lines joined by newlines, as the spec says). */
export async function* serverSentEvents(resp) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      let event = "message";
      const data = [];
      for (const line of block.split(/\r?\n/)) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) yield { event, data: data.join("\n") };
    }
  }
}

export const ms = (s) => (s == null ? "–" : `${(1000 * s).toFixed(s < 0.1 ? 1 : 0)} ms`);
