// The chat page of `clover serve`: streams /v1/chat/completions with "denoise": true and draws
// each `clover.pass` event as the current block (masked cells filling pass by pass).
"use strict";

const $ = (id) => document.getElementById(id);
const history = [];            // the conversation sent with each request (OpenAI messages)
let controller = null;         // aborts the running request ("Stop")
const seen = { passes: 0, commits: 0 };  // what the denoise view has drawn (the page test reads it)

async function loadInfo() {
  const health = await (await fetch("/health")).json();
  $("model").textContent = `${health.model} · ${health.mode}`;
  for (const mode of health.modes) {
    const option = new Option(mode, mode, mode === health.mode, mode === health.mode);
    $("mode").add(option);
  }
  $("key-label").hidden = !health.auth;
  $("api-key").value = localStorage.getItem("clover-api-key") || "";
  document.body.dataset.ready = "1";
}

function element(tag, className, text) {
  const el = document.createElement(tag);
  if (className) el.className = className;
  if (text !== undefined) el.textContent = text;
  return el;
}

function addMessage(role, text) {
  const msg = element("div", `msg ${role}`);
  if (role === "assistant") {
    const thinking = element("details", "thinking");
    thinking.open = true;
    thinking.hidden = true;
    thinking.append(element("summary", "", "thinking"), element("div", "text"));
    msg.append(thinking, element("div", "content"), element("div", "stats"));
  } else {
    msg.textContent = text;
  }
  $("log").append(msg);
  $("log").scrollTop = $("log").scrollHeight;
  return msg;
}

function visible(piece) {
  return piece.replace(/\n/g, "↵").replace(/\t/g, "→") || "·";
}

// One `clover.pass` event: a pass redraws the block, a commit (or an AR step) is counted.
function drawDenoise(ev) {
  const block = $("block");
  if (ev.type === "pass") {
    seen.passes += 1;
    const filled = new Set(ev.filled);
    block.className = "block";
    block.replaceChildren(...ev.tokens.map((piece, i) => {
      if (piece === null) return element("span", "cell masked", "░");
      return element("span", filled.has(i) ? "cell new" : "cell known", visible(piece));
    }));
    const masked = ev.tokens.filter((t) => t === null).length;
    $("denoise-stats").textContent =
      `block ${ev.block + 1} · pass ${ev.pass + 1} · ${ev.filled.length} filled · ${masked} masked`;
  } else if (ev.type === "commit" || ev.type === "step") {
    seen.commits += 1;
    if (ev.type === "step") {
      seen.passes += 1;
      block.className = "block committed";
      block.replaceChildren(element("span", "cell new", visible(ev.text)));
      $("denoise-stats").textContent = `token ${ev.tokens}`;
    } else {
      block.className = "block committed";
    }
    $("totals").textContent = `${ev.tokens} tokens committed`;
  }
  document.body.dataset.passes = String(seen.passes);
}

// Server-sent events from a fetch body: yields {event, data} per blank-line-separated record.
async function* sse(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const record = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = "message";
      const data = [];
      for (const line of record.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) yield { event, data: data.join("\n") };
    }
  }
}

function requestBody() {
  const body = { messages: history, stream: true, denoise: true, thinking: $("thinking").checked,
                 mode: $("mode").value || undefined };
  const threshold = parseFloat($("threshold").value);
  const maxTokens = parseInt($("max-tokens").value, 10);
  if (!Number.isNaN(threshold)) body.threshold = threshold;
  if (!Number.isNaN(maxTokens)) body.max_tokens = maxTokens;
  return body;
}

function showStats(el, usage, stats, finish) {
  const parts = [`${usage.completion_tokens} tokens`, `finish: ${finish}`];
  if (stats) {
    parts.push(`${stats.passes} passes`, `${stats.mean_tokens_per_pass.toFixed(2)} tokens/pass`,
               `${stats.generation_tokens_per_s.toFixed(1)} tokens/s`,
               `prompt ${usage.prompt_tokens} tokens in ${stats.prompt_ms.toFixed(0)} ms`);
    el.dataset.passes = String(stats.passes);
  }
  el.textContent = parts.join(" · ");
}

async function send(text) {
  history.push({ role: "user", content: text });
  addMessage("user", text);
  const msg = addMessage("assistant");
  const thinking = msg.querySelector(".thinking");
  const answer = { content: "", reasoning: "" };
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  msg.dataset.state = "streaming";
  seen.passes = 0;
  seen.commits = 0;
  const key = $("api-key").value;
  localStorage.setItem("clover-api-key", key);
  try {
    const headers = { "Content-Type": "application/json" };
    if (key) headers.Authorization = `Bearer ${key}`;
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers, body: JSON.stringify(requestBody()), signal: controller.signal });
    if (!response.ok) {
      const err = await response.json().catch(() => ({}));
      throw new Error((err.error && err.error.message) || `HTTP ${response.status}`);
    }
    for await (const { event, data } of sse(response)) {
      if (data === "[DONE]") break;
      const payload = JSON.parse(data);
      if (event === "clover.pass") { drawDenoise(payload); continue; }
      if (payload.error) throw new Error(payload.error.message);
      const choice = payload.choices[0];
      const delta = choice.delta || {};
      if (delta.reasoning_content) {
        answer.reasoning += delta.reasoning_content;
        thinking.hidden = false;
        thinking.querySelector(".text").textContent = answer.reasoning;
      }
      if (delta.content) {
        answer.content += delta.content;
        msg.querySelector(".content").textContent = answer.content;
      }
      if (choice.finish_reason) showStats(msg.querySelector(".stats"), payload.usage, payload.clover,
                                          choice.finish_reason);
      $("log").scrollTop = $("log").scrollHeight;
    }
    msg.dataset.state = "done";
  } catch (e) {
    msg.dataset.state = e.name === "AbortError" ? "stopped" : "error";
    msg.append(element("div", "error", e.name === "AbortError" ? "stopped" : e.message));
  } finally {
    // the turn joins the conversation (what was received of it, when stopped)
    const reply = { role: "assistant", content: answer.content };
    if (answer.reasoning) reply.reasoning_content = answer.reasoning;
    history.push(reply);
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || controller) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("clear").addEventListener("click", () => {
  if (controller) controller.abort();
  history.length = 0;
  $("log").replaceChildren();
  $("block").replaceChildren();
  $("denoise-stats").textContent = "";
  $("totals").textContent = "";
});
loadInfo().catch((e) => { $("model").textContent = `server unreachable: ${e.message}`; });
