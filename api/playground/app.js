// The Bernard playground: plain JavaScript, no build step.
//
// It talks to the conversations API (README.md, "Conversations, and tools that wait for
// you"). A turn's named SSE events are read with fetch() and parsed here, because the
// browser's EventSource can neither POST nor send an Authorization header.
//
// The turn being answered ("live") is a list of segments (text, tool cards, confirmation
// cards, trace lines, errors) built from its events. It is saved in sessionStorage with the
// id of the last event it holds, both in one write, at most once a frame while events come
// and at once when the page is left or hidden, so a reload redraws it and reattaches with
// `GET /v1/turns/{id}/events` and `Last-Event-ID`: nothing is lost or repeated. A
// conversation opened while a turn started elsewhere runs on it (its `turn_id`) is followed
// the same way, from that turn's first event. Model output is rendered as Markdown and
// sanitized with DOMPurify before it reaches the page; tool arguments and results are only
// ever set as text.
"use strict";

const KEY_STORE = "bernard.apiKey"; // localStorage: the bearer key
const TRACE_STORE = "bernard.trace"; // localStorage: the trace toggle
const LIVE_STORE = "bernard.live"; // sessionStorage: the live turn
const EVENTS_STORE = "bernard.eventsCursor"; // sessionStorage: last id on GET /v1/events
const LONG_RESULT_CHARS = 300;

const $ = (selector) => document.querySelector(selector);
const ui = {
  log: $("#log"),
  list: $("#conversations"),
  input: $("#input"),
  send: $("#send"),
  cancel: $("#cancel"),
  trace: $("#trace"),
  keybox: $("#keybox"),
  keyInput: $("#key-input"),
  keyMessage: $("#key-message"),
  notices: $("#notices"),
};
let current = null; // the open conversation's id (null: a new one starts on send)
let live = null; // the live turn, see the header
let nodes = new Map(); // segment -> its element (not saved)

// -- the API ---------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(method, path, { body, stream = false, headers = {} } = {}) {
  const sent = { ...headers };
  const key = localStorage.getItem(KEY_STORE);
  if (key) sent.Authorization = `Bearer ${key}`;
  if (body !== undefined) sent["Content-Type"] = "application/json";
  if (stream) sent.Accept = "text/event-stream";
  const init = { method, headers: sent };
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  if (response.ok) return response;
  const error = (await response.json().catch(() => null))?.error ?? {};
  if (response.status === 401) showKeyBox(error.message);
  throw new ApiError(response.status, error.message || response.statusText, error.code);
}

async function getJSON(path) {
  return (await api("GET", path)).json();
}

const conversationPath = (id) => `v1/conversations/${encodeURIComponent(id)}`;

// Named SSE events of a response: {id, event, data}, as the WHATWG spec parses them.
async function* sseEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let frame = { id: null, event: "", data: [] };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    for (;;) {
      const end = /\r\n|\r|\n/.exec(buffer);
      // A lone "\r" at the end may be the first half of "\r\n": wait for more.
      if (!end || (end[0] === "\r" && end.index === buffer.length - 1)) break;
      const line = buffer.slice(0, end.index);
      buffer = buffer.slice(end.index + end[0].length);
      if (line === "") {
        if (frame.data.length) yield { ...frame, data: frame.data.join("\n") };
        frame = { id: null, event: "", data: [] };
        continue;
      }
      if (line.startsWith(":")) continue; // a keepalive comment
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let text = colon < 0 ? "" : line.slice(colon + 1);
      if (text.startsWith(" ")) text = text.slice(1);
      if (field === "data") frame.data.push(text);
      else if (field === "event") frame.event = text;
      else if (field === "id") frame.id = text;
    }
  }
}

// -- Markdown, sanitized -----------------------------------------------------------------

// Model output is Markdown only: HTML in it is shown as text, never parsed (parsing markup
// with inline handlers, even inertly, trips the page's CSP). DOMPurify then checks what
// Markdown itself made (a `javascript:` link, say).
const escapeHTML = (text) =>
  text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

marked.use({
  gfm: true,
  renderer: {
    html({ text }) {
      return escapeHTML(text);
    },
    // An image in model output becomes a link: the page loads nothing a model names.
    image({ href, text }) {
      const a = document.createElement("a");
      a.href = href;
      a.textContent = text || href;
      return a.outerHTML;
    },
  },
});
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});
const PURIFY = {
  RETURN_DOM_FRAGMENT: true,
  FORBID_TAGS: ["img", "style", "form", "input", "button", "textarea", "select", "video", "audio"],
  FORBID_ATTR: ["style"],
};

function renderMarkdown(element, text) {
  const html = marked.parse(text, { async: false });
  element.replaceChildren(DOMPurify.sanitize(html, PURIFY));
}

// -- small DOM helpers -----------------------------------------------------------------

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function prettyJSON(text) {
  try {
    return JSON.stringify(typeof text === "string" ? JSON.parse(text) : text, null, 2);
  } catch {
    return String(text);
  }
}

function scrollDown() {
  ui.log.scrollTop = ui.log.scrollHeight;
}

function notice(text, className = "") {
  const item = el("div", `notice ${className}`, text);
  const close = el("button", "quiet", "×");
  close.type = "button";
  close.title = "Dismiss";
  close.addEventListener("click", () => item.remove());
  item.append(close);
  ui.notices.append(item);
}

// -- segments: what a turn shows ---------------------------------------------------------

function drawSegment(segment) {
  const following = ui.log.scrollHeight - ui.log.scrollTop - ui.log.clientHeight < 40;
  let node = nodes.get(segment);
  if (!node) {
    node = el("div");
    nodes.set(segment, node);
    ui.log.append(node);
  }
  const draw = { user: drawUser, text: drawText, tool: drawTool, confirm: drawConfirm,
    trace: drawTrace, error: drawError, status: drawStatus }[segment.kind];
  draw(node, segment);
  if (following) scrollDown();
}

// Streamed text is redrawn once per frame, however many deltas arrived in it.
const dirty = new Set();
function drawSoon(segment) {
  if (!dirty.size) requestAnimationFrame(drawDirty);
  dirty.add(segment);
}

function drawDirty() {
  dirty.forEach(drawSegment);
  dirty.clear();
}

function drawUser(node, segment) {
  node.className = "bubble user";
  node.textContent = segment.text;
}

function drawText(node, segment) {
  node.className = "bubble assistant markdown";
  renderMarkdown(node, segment.text);
}

function drawTool(node, segment) {
  const failed = segment.result?.is_error || segment.failed;
  node.className = `card tool${failed ? " error" : ""}`;
  const state = segment.result ? (failed ? "failed" : "done") : segment.stored ? "no result" : "running…";
  const head = el("div", "card-head");
  head.append(el("span", "tool-name", segment.name), el("span", "state", state));
  const parts = [head, el("pre", "args", prettyJSON(segment.arguments))];
  if (!segment.result && segment.progress !== null) {
    const bar = el("progress");
    if (segment.progress !== undefined) bar.value = segment.progress;
    parts.push(bar);
  }
  if (segment.steps.length) {
    const steps = el("ul", "steps");
    for (const step of segment.steps) steps.append(el("li", "", step));
    parts.push(steps);
  }
  if (segment.result) parts.push(resultBlock(segment.result.output));
  node.replaceChildren(...parts);
}

function resultBlock(output) {
  const text = String(output ?? "");
  const block = el("details", "result");
  const long = text.length > LONG_RESULT_CHARS || text.split("\n").length > 6;
  block.open = !long;
  block.append(el("summary", "", long ? `Result (${text.length} characters)` : "Result"));
  block.append(el("pre", "", text));
  return block;
}

function drawConfirm(node, segment) {
  node.className = `card confirm ${segment.state}`;
  const head = el("div", "card-head");
  head.append(el("span", "tool-name", segment.tool_call.name), el("span", "state", confirmState(segment)));
  const args = el("textarea", "confirm-args");
  args.value = segment.edited ?? prettyJSON(segment.tool_call.arguments);
  args.rows = Math.min(10, args.value.split("\n").length + 1);
  args.disabled = segment.state !== "pending";
  args.addEventListener("input", () => (segment.edited = args.value));
  const approve = el("button", "approve", "Approve");
  const reject = el("button", "reject danger", "Reject");
  for (const [button, decision] of [[approve, "approve"], [reject, "reject"]]) {
    button.type = "button";
    button.disabled = segment.state !== "pending";
    button.addEventListener("click", () => decide(segment, decision, args.value));
  }
  const actions = el("div", "actions");
  actions.append(approve, reject);
  const problem = el("div", "problem", segment.problem || "");
  node.replaceChildren(head, el("p", "summary", segment.summary), args, actions, problem);
}

function confirmState(segment) {
  return { pending: "waiting for your decision", sending: "sending…", approve: "approved",
    reject: "rejected", closed: "closed" }[segment.state];
}

function drawTrace(node, segment) {
  node.className = "trace";
  if (segment.type === "llm_prompt") {
    const block = el("details");
    block.append(el("summary", "", `prompt → ${segment.stage} model ${segment.model}: ${segment.messages.length} messages`));
    block.append(el("pre", "", JSON.stringify(segment.messages, null, 2)));
    node.replaceChildren(block);
  } else if (segment.type === "llm_call_complete") {
    const usage = segment.usage ? ` · ${segment.usage.prompt_tokens ?? 0} in, ${segment.usage.completion_tokens ?? 0} out` : "";
    node.textContent = `${segment.stage} model ${segment.model}: ${Math.round(segment.latency_ms)} ms${usage}`;
  } else if (segment.type === "memory") {
    node.textContent = `memory: ${segment.kept} of ${segment.stored} messages kept, ${segment.notes} notes, ~${segment.tokens} of ${segment.budget} tokens`;
  } else if (segment.type === "usage") {
    const u = segment.usage;
    node.textContent = `turn: ${u.prompt_tokens} prompt + ${u.completion_tokens} completion = ${u.total_tokens} tokens`;
  }
}

function drawError(node, segment) {
  node.className = "error-line";
  node.textContent = `${segment.code ? `${segment.code}: ` : ""}${segment.message}`;
}

function drawStatus(node, segment) {
  node.className = "status-line";
  node.textContent = segment.text;
}

// -- the live turn ---------------------------------------------------------------------

// A save writes the whole live turn, so one per event would make a long answer cost time
// quadratic in its length: events queue one save for the next frame (when what they changed
// is drawn too), and leaving or hiding the page saves what is queued at once (`bind`).
// Every save pairs the segments with the id of the last event they hold, so one that lags
// behind the page only means more events replayed on reattaching, none lost or repeated.
let saveQueued = false;

function saveLive() {
  saveQueued = false;
  sessionStorage.setItem(LIVE_STORE, JSON.stringify(live));
}

function saveLiveSoon() {
  if (!saveQueued) requestAnimationFrame(saveQueuedLive);
  saveQueued = true;
}

function saveQueuedLive() {
  if (saveQueued && live) saveLive();
  saveQueued = false;
}

function startLive(conversationId, userText) {
  live = { conversationId, turnId: null, lastEventId: null, segments: [] };
  if (userText) addSegment({ kind: "user", text: userText });
  saveLive();
  setBusy(true);
}

function endLive() {
  drawDirty(); // the turn's last words are on the page before it says it is done
  live = null;
  sessionStorage.removeItem(LIVE_STORE);
  setBusy(false);
  refreshList();
}

function addSegment(segment) {
  live.segments.push(segment);
  drawSegment(segment);
  return segment;
}

function toolSegment(callId) {
  return live.segments.find((s) => s.kind === "tool" && s.id === callId);
}

// One event of the live turn: update its segments, redraw what changed.
function applyEvent(name, data) {
  const last = live.segments[live.segments.length - 1];
  if (name === "text_delta") {
    if (last?.kind === "text") {
      last.text += data.text;
      drawSoon(last);
    } else addSegment({ kind: "text", text: data.text });
  } else if (name === "tool_call") {
    addSegment({ kind: "tool", id: data.id, name: data.name, arguments: data.arguments, steps: [], progress: undefined, result: null });
  } else if (name === "tool_progress") {
    const tool = toolSegment(data.tool_call_id);
    if (!tool) return;
    if (data.current != null && data.total) tool.progress = data.current / data.total;
    if (data.phase === "error") tool.failed = true;
    if (data.message) tool.steps.push(data.message);
    drawSegment(tool);
  } else if (name === "tool_result") {
    const tool = toolSegment(data.tool_call_id);
    if (!tool) return;
    tool.result = { output: data.output, is_error: data.is_error };
    drawSegment(tool);
  } else if (name === "awaiting_confirmation") {
    addSegment({ kind: "confirm", ...data, state: "pending" });
  } else if (name === "trace") {
    addSegment({ kind: "trace", ...data });
  } else if (name === "error") {
    addSegment({ kind: "error", code: data.code, message: data.message });
  } else if (name === "done") {
    if (data.error) addSegment({ kind: "error", code: data.error.code, message: data.error.message });
    if (data.status === "cancelled") addSegment({ kind: "status", text: "Cancelled." });
    if (data.usage?.total_tokens) addSegment({ kind: "trace", type: "usage", usage: data.usage });
  }
}

// Read a turn's events until `done`; true when the turn ended, false when the stream broke.
async function follow(response) {
  for await (const frame of sseEvents(response)) {
    if (!live) return true;
    if (frame.id) live.lastEventId = frame.id;
    applyEvent(frame.event, JSON.parse(frame.data));
    saveLiveSoon();
    if (frame.event === "done") return true;
  }
  return false;
}

// Start a turn with `request` (a POST answering its events) and show it to its end.
async function runTurn(request) {
  let response;
  try {
    response = await request();
  } catch (error) {
    addSegment({ kind: "error", code: error.code, message: error.message });
    return endLive();
  }
  live.turnId = response.headers.get("X-Bernard-Turn-Id");
  saveLive();
  let ended = false;
  try {
    ended = await follow(response);
  } catch {
    // The connection broke mid-turn: the turn runs on, so reattach to it.
  }
  if (ended) endLive();
  else await reattach();
}

// Continue the live turn after its last event (after a reload, or a broken connection).
async function reattach() {
  for (let attempt = 0; live?.turnId && attempt < 5; attempt++) {
    const headers = live.lastEventId ? { "Last-Event-ID": live.lastEventId } : {};
    try {
      const path = `v1/turns/${encodeURIComponent(live.turnId)}/events`;
      if (await follow(await api("GET", path, { stream: true, headers }))) return endLive();
    } catch (error) {
      // A network error, a 429 or a 5xx may pass; any other answer will not.
      if (error instanceof ApiError && error.status !== 429 && error.status < 500) {
        addSegment({ kind: "error", code: error.code, message: error.message });
        return endLive();
      }
    }
    await new Promise((resolve) => setTimeout(resolve, 500 * (attempt + 1)));
  }
  if (live?.turnId) addSegment({ kind: "status", text: "Lost the answer's stream: open the conversation again to see how it ended." });
  if (live) endLive();
}

function setBusy(busy) {
  ui.send.hidden = busy;
  ui.cancel.hidden = !busy;
  ui.cancel.disabled = false;
}

// -- actions -----------------------------------------------------------------------------

async function send(text) {
  if (live) return;
  let id = current;
  if (!id) {
    const created = await (await api("POST", "v1/conversations", { body: { metadata: { title: text.slice(0, 60) } } })).json();
    id = created.id;
    setCurrent(id);
    refreshList();
  }
  startLive(id, text);
  const body = { content: text, trace: ui.trace.checked };
  await runTurn(() => api("POST", `${conversationPath(id)}/messages`, { body, stream: true }));
}

async function decide(segment, decision, argumentsText) {
  if (live) return;
  const body = { confirmation_id: segment.confirmation_id, decision, trace: ui.trace.checked };
  if (decision === "approve" && argumentsText.trim() !== prettyJSON(segment.tool_call.arguments).trim()) {
    try {
      body.arguments = JSON.parse(argumentsText);
    } catch (error) {
      segment.problem = `The arguments are not JSON: ${error.message}`;
      return drawSegment(segment);
    }
  }
  segment.state = "sending";
  segment.problem = "";
  drawSegment(segment);
  try {
    const response = await api("POST", `${conversationPath(current)}/resume`, { body, stream: true });
    segment.state = decision;
    drawSegment(segment);
    startLive(current, null);
    await runTurn(async () => response);
  } catch (error) {
    segment.state = error.status === 400 ? "pending" : "closed";
    segment.problem = error.message;
    drawSegment(segment);
  }
}

async function cancel() {
  if (!live?.turnId) return;
  ui.cancel.disabled = true;
  await api("POST", `v1/turns/${encodeURIComponent(live.turnId)}/cancel`).catch(() => {});
}

// -- conversations -----------------------------------------------------------------------

// The open conversation is in the URL's fragment, so a reload opens it again.
function setCurrent(id) {
  current = id;
  history.replaceState(null, "", id ? `#${encodeURIComponent(id)}` : location.pathname);
  markCurrent();
}

function markCurrent() {
  for (const item of ui.list.children) item.classList.toggle("current", item.dataset.id === current);
}

async function refreshList() {
  let page;
  try {
    page = await getJSON("v1/conversations?limit=100");
  } catch {
    return;
  }
  ui.list.replaceChildren(...page.data.map(listItem));
  markCurrent();
}

function listItem(conversation) {
  const item = el("li");
  item.dataset.id = conversation.id;
  const open = el("button", "open", conversation.metadata?.title || conversation.id);
  open.type = "button";
  open.title = `${conversation.id} · ${conversation.message_count} messages · ${conversation.status}`;
  open.addEventListener("click", () => openConversation(conversation.id));
  const remove = el("button", "delete quiet", "×");
  remove.type = "button";
  remove.title = "Delete this conversation";
  remove.addEventListener("click", () => removeConversation(conversation.id, remove));
  item.append(open, remove);
  return item;
}

async function removeConversation(id, button) {
  if (!button.classList.contains("armed")) {
    button.classList.add("armed");
    button.textContent = "Delete?";
    return;
  }
  await api("DELETE", conversationPath(id)).catch(() => {});
  if (current === id) newConversation();
  refreshList();
}

function newConversation() {
  if (live) return;
  setCurrent(null);
  nodes = new Map();
  ui.log.replaceChildren();
  ui.input.focus();
}

async function allRows(id) {
  const rows = [];
  let after = "";
  for (;;) {
    const page = await getJSON(`${conversationPath(id)}/messages?limit=1000${after}`);
    rows.push(...page.data);
    if (!page.has_more) return rows;
    after = `&after=${encodeURIComponent(page.last_id)}`;
  }
}

// Show a conversation: its stored rows, then the live turn (if it is this one's). A turn
// running on it that this page did not start (another tab, the CLI, a voice satellite)
// becomes the live turn: its events are replayed from the start, and followed to its end.
async function openConversation(id) {
  if (live && live.conversationId !== id) return notice("An answer is still coming: wait for it, or cancel it.");
  let conversation, rows;
  try {
    [conversation, rows] = await Promise.all([getJSON(conversationPath(id)), allRows(id)]);
  } catch (error) {
    if (error.status === 404) setCurrent(null);
    return;
  }
  setCurrent(id);
  nodes = new Map();
  ui.log.replaceChildren();
  const joined = conversation.status === "running" && conversation.turn_id && !live;
  if (joined) {
    // Its events do not hold the user's message: that comes from its stored rows.
    const asked = rows.filter((row) => row.turn_id === conversation.turn_id && row.role === "user");
    live = { conversationId: id, turnId: conversation.turn_id, lastEventId: null, segments: [] };
    asked.forEach((row) => live.segments.push({ kind: "user", text: rowText(row) }));
    saveLive();
    setBusy(true);
  }
  drawRows(rows.filter((row) => !live || row.turn_id !== live.turnId));
  if (conversation.pending_confirmation && !live) {
    drawSegment({ kind: "confirm", ...conversation.pending_confirmation, state: "pending" });
  }
  if (live) live.segments.forEach(drawSegment);
  if (joined) await reattach();
}

function rowText(row) {
  return typeof row.content === "string" ? row.content : (row.content || []).map((part) => part.text || "").join("");
}

function drawRows(rows) {
  const tools = new Map();
  for (const row of rows) {
    const text = rowText(row);
    if (row.role === "user") drawSegment({ kind: "user", text });
    else if (row.role === "assistant") {
      if (text) drawSegment({ kind: "text", text });
      for (const call of row.tool_calls || []) {
        const segment = { kind: "tool", id: call.id, name: call.function.name, arguments: call.function.arguments, steps: [], progress: null, result: null, stored: true };
        tools.set(call.id, segment);
        drawSegment(segment);
      }
    } else if (row.role === "tool" && tools.has(row.tool_call_id)) {
      const segment = tools.get(row.tool_call_id);
      segment.result = { output: text, is_error: false };
      drawSegment(segment);
    }
  }
}

// -- the user's own events: timers -------------------------------------------------------

async function watchEvents() {
  for (;;) {
    const cursor = sessionStorage.getItem(EVENTS_STORE);
    try {
      const response = await api("GET", "v1/events", { stream: true, headers: cursor ? { "Last-Event-ID": cursor } : {} });
      for await (const frame of sseEvents(response)) {
        if (frame.id) sessionStorage.setItem(EVENTS_STORE, frame.id);
        if (frame.event === "timer_fired") timerFired(JSON.parse(frame.data));
      }
    } catch (error) {
      if (error.status === 401) return; // starts again once a key is saved
    }
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

function timerFired(timer) {
  notice(`⏰ Timer “${timer.label || "timer"}” is done.`, "timer");
  if (timer.conversation_id && timer.conversation_id === current && !live) openConversation(current);
  refreshList();
}

// -- the API key -------------------------------------------------------------------------

function showKeyBox(message) {
  ui.keyMessage.textContent = message ? `This server needs an API key: ${message}` : "API key (one of BERNARD_API_KEYS)";
  ui.keybox.hidden = false;
  ui.keyInput.focus();
}

function saveKey(event) {
  event.preventDefault();
  localStorage.setItem(KEY_STORE, ui.keyInput.value.trim());
  ui.keyInput.value = "";
  ui.keybox.hidden = true;
  start();
}

// -- start -------------------------------------------------------------------------------

let watching = false;

async function start() {
  await refreshList();
  if (!ui.keybox.hidden) return; // a 401: wait for the key
  if (!watching) {
    watching = true;
    watchEvents().finally(() => (watching = false));
  }
  const saved = JSON.parse(sessionStorage.getItem(LIVE_STORE) || "null");
  const wanted = decodeURIComponent(location.hash.slice(1));
  if (saved && !live) {
    live = saved;
    setBusy(true);
    await openConversation(saved.conversationId);
    await reattach();
  } else if (wanted && !live) {
    await openConversation(wanted);
  }
}

function bind() {
  // A reload, a navigation or a closed tab (pagehide), or a tab put in the background, where
  // frames stop (visibilitychange): the queued save cannot wait for the next frame.
  addEventListener("pagehide", saveQueuedLive);
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) saveQueuedLive();
  });
  ui.trace.checked = localStorage.getItem(TRACE_STORE) === "1";
  document.body.classList.toggle("show-trace", ui.trace.checked);
  ui.trace.addEventListener("change", () => {
    localStorage.setItem(TRACE_STORE, ui.trace.checked ? "1" : "0");
    document.body.classList.toggle("show-trace", ui.trace.checked);
  });
  $("#composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = ui.input.value.trim();
    if (!text || live) return;
    ui.input.value = "";
    send(text).catch((error) => notice(error.message, "error"));
  });
  ui.input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("#composer").requestSubmit();
    }
  });
  ui.cancel.addEventListener("click", cancel);
  $("#new-conversation").addEventListener("click", newConversation);
  $("#key-button").addEventListener("click", () => showKeyBox());
  $("#key-forget").addEventListener("click", () => {
    localStorage.removeItem(KEY_STORE);
    showKeyBox();
  });
  ui.keybox.addEventListener("submit", saveKey);
}

bind();
start();
