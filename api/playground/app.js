// The Bernard playground: plain JavaScript, no build step.
//
// It talks to the conversations API (docs/api.md, "Conversations"). A turn's named SSE events are read with fetch() and parsed here, because the
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
//
// An answer stopped before its end (the user's Cancel, or a newer message from another
// client interrupting it) is stored as far as it went, marked `stopped`: reloaded, it shows
// as it stood, with why it stops there. An interrupted turn hands the page to the message
// that interrupted it, which the page then follows.
//
// Each tool call is one card from its proposal to its result, found by the call's id
// whichever event or stored row names it; it says which rule of the household's policy let
// it run, asked or refused it, and the last change to the house has an Undo button
// (`POST /v1/conversations/{id}/undo`, a turn like a message's). A message typed while a call waits for the
// user's decision stays in the box with a hint (`showHint`). A new conversation opens on
// prompts that fit the server's tools (`GET /v1/tools`); the footer says what the server
// runs (`GET /v1/status`).
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
  hint: $("#hint"),
  hintText: $("#hint-text"),
  hintReject: $("#hint-reject"),
  status: $("#status"),
  menu: $("#menu"),
  backdrop: $("#backdrop"),
};
let current = null; // the open conversation's id (null: a new one starts on send)
let live = null; // the live turn, see the header
let nodes = new Map(); // segment -> its element (not saved)
let calls = new Map(); // tool call id -> its segment, in the conversation shown
const STOPPED = "Stopped.";
const INTERRUPTED = "Interrupted: a newer message in this conversation took its place.";
const ErrorCode = { CANCELLED: "turn_cancelled", INTERRUPTED: "turn_interrupted", BUSY: "conversation_busy" };
// What an answer stored unfinished (its row's `stopped`, the code of its turn's ending) says.
const STOPPED_BY = { [ErrorCode.CANCELLED]: STOPPED, [ErrorCode.INTERRUPTED]: INTERRUPTED };

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

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

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
  const draw = { user: drawUser, text: drawText, call: drawCall, trace: drawTrace,
    error: drawError, status: drawStatus }[segment.kind];
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

// One card per tool call, from its proposal (when it waits for the user's decision) to its
// result: the decision and the arguments that ran are shown in place. A call's segment is
// found by its id (`calls`), whichever event or stored row names it.
function drawCall(node, segment) {
  const failed = segment.result?.is_error || segment.failed;
  const confirm = segment.decision ? ` confirm ${segment.decision}` : "";
  node.className = `card tool${confirm}${failed ? " error" : ""}`;
  const head = el("div", "card-head");
  head.append(el("span", "tool-name", segment.name), el("span", "state", callState(segment)));
  const parts = [head];
  if (segment.policy) parts.push(el("p", "policy", policyLine(segment.policy)));
  const edited = segment.proposed !== undefined && !sameJSON(segment.arguments, segment.proposed);
  if (segment.summary) parts.push(el("p", `summary${edited ? " proposed" : ""}`, segment.summary));
  if (segment.decision === "pending" || segment.decision === "sending") {
    parts.push(...decisionControls(segment));
  } else {
    parts.push(el("pre", "args", prettyJSON(segment.arguments)));
    const decided = { approve: edited ? "Approved with your edits" : "Approved",
      reject: "Rejected: it did not run", closed: "Not decided" }[segment.decision];
    if (decided) parts.push(el("p", "decision", decided));
  }
  if (running(segment) && segment.progress !== null) {
    const bar = el("progress");
    if (segment.progress !== undefined) bar.value = segment.progress;
    parts.push(bar);
  }
  if (segment.steps.length) {
    const steps = el("ul", "steps");
    for (const step of segment.steps) steps.append(el("li", "", step));
    parts.push(steps);
  }
  // A rejected call's result is only what the model was told: the decision says it.
  if (segment.result && segment.decision !== "reject") parts.push(resultBlock(segment.result.output));
  if (segment === lastChange()) {
    const undo = el("button", "undo", "Undo");
    undo.type = "button";
    undo.addEventListener("click", () => undoLast(segment));
    const actions = el("div", "actions");
    actions.append(undo);
    parts.push(actions);
  }
  if (segment.problem) parts.push(el("div", "problem", segment.problem));
  node.replaceChildren(...parts);
}

// What the policy said of a call (worker/tools/policy.py `Ruling.shown`).
function policyLine(policy) {
  const said = { allow: "Ran at once", ask: "Asked first", deny: "Refused for this key" }[policy.decision] || policy.decision;
  return `${said}: rule “${policy.rule}”`;
}

// The conversation's last change to the house that ran and was not undone: undo puts it back.
function lastChange() {
  let found = null;
  for (const call of calls.values()) {
    if (call.name === "ha_call_service" && call.result && !call.result.is_error && !call.undone) found = call;
  }
  return found;
}

// An undo ran: the change it put back is the last one (the server undoes them in turn).
function markUndone() {
  const undone = lastChange();
  if (undone) undone.undone = true;
}

function redrawChanges() {
  for (const call of calls.values()) if (call.name === "ha_call_service" && nodes.has(call)) drawSegment(call);
}

function decisionControls(segment) {
  const args = el("textarea", "confirm-args");
  args.value = segment.edited ?? prettyJSON(segment.proposed ?? segment.arguments);
  args.rows = Math.min(10, args.value.split("\n").length + 1);
  args.disabled = segment.decision !== "pending";
  args.addEventListener("input", () => (segment.edited = args.value));
  const approve = el("button", "approve", "Approve");
  const reject = el("button", "reject danger", "Reject");
  for (const [button, decision] of [[approve, "approve"], [reject, "reject"]]) {
    button.type = "button";
    button.disabled = segment.decision !== "pending";
    button.addEventListener("click", () => decide(segment, decision, args.value));
  }
  const actions = el("div", "actions");
  actions.append(approve, reject);
  return [args, actions];
}

// Whether the call may still be running: its bar shows then. An approved call runs once
// the turn carrying out its decision names it (`tool_call`).
function running(segment) {
  if (segment.result || segment.stored || segment.ended) return false;
  return !segment.decision || (segment.decision === "approve" && segment.started);
}

function callState(segment) {
  if (segment.decision === "pending") return "waiting for your decision";
  if (segment.decision === "sending") return "sending…";
  if (segment.decision === "waiting") return "waiting for a decision";
  if (segment.decision === "reject") return "rejected";
  if (segment.decision === "closed") return "closed";
  const failed = segment.result?.is_error || segment.failed;
  const outcome = segment.result ? (failed ? "failed" : "done")
    : segment.ended === "cancelled" ? "stopped"
    : segment.stored || segment.ended ? "no result"
    : segment.decision === "approve" && !segment.started ? (segment.deferred ? "runs once every call is decided" : "starting…")
    : "running…";
  return segment.decision === "approve" ? `approved · ${outcome}` : outcome;
}

function sameJSON(a, b) {
  return prettyJSON(a) === prettyJSON(b);
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
  ui.log.querySelector(".welcome")?.remove();
  live = { conversationId, turnId: null, lastEventId: null, segments: [] };
  if (userText) addSegment({ kind: "user", text: userText });
  saveLive();
  setBusy(true);
}

function endLive() {
  drawDirty(); // the turn's last words are on the page before it says it is done
  const interrupted = live?.interrupted && live.conversationId === current;
  live = null;
  sessionStorage.removeItem(LIVE_STORE);
  setBusy(false);
  if (hintShown === "running") hideHint();
  refreshList();
  if (interrupted) openConversation(current);
}

function addSegment(segment) {
  live.segments.push(segment);
  if (segment.kind === "call") calls.set(segment.id, segment);
  drawSegment(segment);
  return segment;
}

// An error once, however many events of the turn carry it (its `error` event, then `done`).
function addError(code, message) {
  if (STOPPED_BY[code]) return addStopped(STOPPED_BY[code]);
  if (live.segments.some((s) => s.kind === "error" && s.code === code && s.message === message)) return;
  addSegment({ kind: "error", code, message });
}

// The user's own Cancel is no error: the turn stopped (or a newer message took its place).
function addStopped(text = STOPPED) {
  if (live.segments.some((s) => s.kind === "status" && Object.values(STOPPED_BY).includes(s.text))) return;
  addSegment({ kind: "status", text });
}

function newCall(data) {
  return { kind: "call", id: data.id, name: data.name, arguments: data.arguments, policy: data.policy || null, steps: [], progress: undefined, result: null };
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
    // A call the user approved is already on the page (its proposal): it runs there.
    const call = calls.get(data.id);
    if (!call) return addSegment(newCall(data));
    Object.assign(call, { arguments: data.arguments, policy: data.policy || call.policy, started: true, stored: false, progress: undefined });
    drawSegment(call);
  } else if (name === "tool_progress") {
    const call = calls.get(data.tool_call_id);
    if (!call) return;
    if (data.current != null && data.total) call.progress = data.current / data.total;
    if (data.phase === "error") call.failed = true;
    if (data.message) call.steps.push(data.message);
    drawSegment(call);
  } else if (name === "tool_result") {
    const call = calls.get(data.tool_call_id);
    if (!call) return;
    call.result = { output: data.output, is_error: data.is_error };
    drawSegment(call);
    if (call.name === "undo" && !data.is_error) markUndone();
    if (["ha_call_service", "undo"].includes(call.name)) redrawChanges(); // the Undo button moves
  } else if (name === "awaiting_confirmation") {
    const proposal = { confirmation_id: data.confirmation_id, summary: data.summary, proposed: data.tool_call.arguments };
    const call = calls.get(data.tool_call.id);
    if (call) {
      // Already shown (a step's other proposal, repeated by the answer to a decision).
      if (!call.decision || call.decision === "waiting") Object.assign(call, proposal, { decision: "pending" });
      drawSegment(call);
    } else addSegment({ ...newCall(data.tool_call), ...proposal, decision: "pending", progress: null });
  } else if (name === "message") {
    // The row of the turn's own message: a turn followed from elsewhere shows it here,
    // stored as the turn began (one this page sent shows it already).
    if (data.role === "user" && !live.segments.some((s) => s.kind === "user")) {
      addSegment({ kind: "user", text: rowText(data) });
    }
  } else if (name === "trace") {
    addSegment({ kind: "trace", ...data });
  } else if (name === "error") {
    addError(data.code, data.message);
  } else if (name === "done") {
    if (data.error) addError(data.error.code, data.error.message);
    if (data.status === "cancelled") addStopped();
    // The message that interrupted it runs next, sent from elsewhere: the page shows it.
    if (data.error?.code === ErrorCode.INTERRUPTED) live.interrupted = true;
    if (["cancelled", "failed"].includes(data.status)) {
      for (const call of live.segments) {
        if (call.kind === "call" && !call.result && call.decision !== "pending") {
          call.ended = data.status;
          drawSegment(call);
        }
      }
    }
    if (data.status === "awaiting_confirmation") {
      // A decision that left others of its step waiting: nothing ran yet.
      for (const call of live.segments) {
        if (call.kind === "call" && call.decision === "approve" && !call.started) {
          call.deferred = true;
          drawSegment(call);
        }
      }
    }
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
    await sleep(500 * (attempt + 1));
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

let sending = false; // a message is on its way, its turn not live yet

// Send `text` as a message of the open conversation (of a new one if none is open). The
// box keeps the text until the API takes it (`fromBox`): a conversation found busy (a
// decision waits, or a turn started elsewhere runs) says so beside it, and nothing is lost.
async function send(text, { fromBox = false } = {}) {
  if (live || sending) return;
  sending = true;
  setBusy(true);
  hideHint();
  let id = current;
  let response;
  try {
    if (!id) {
      id = (await (await api("POST", "v1/conversations", { body: {} })).json()).id;
      previews.set(id, preview(text));
      setCurrent(id);
      refreshList();
    }
    const body = { content: text, trace: ui.trace.checked };
    response = await api("POST", `${conversationPath(id)}/messages`, { body, stream: true });
  } catch (error) {
    setBusy(false);
    if (error.code === ErrorCode.BUSY) return conversationBusy(id);
    return notice(error.message, "error");
  } finally {
    sending = false;
  }
  if (fromBox && ui.input.value.trim() === text) ui.input.value = "";
  startLive(id, text);
  await runTurn(async () => response);
}

// The message found its conversation busy, changed elsewhere: show it as it stands (the
// decision it waits for, or the turn it runs, which the page then follows), with the hint.
async function conversationBusy(id) {
  let conversation;
  try {
    conversation = await getJSON(conversationPath(id));
  } catch {
    return;
  }
  const waiting = conversation.status === "awaiting_confirmation";
  const opened = openConversation(id);
  if (waiting) await opened;
  showHint(waiting ? "waiting" : "running");
}

async function decide(segment, decision, argumentsText) {
  if (live || sending) return;
  const body = { confirmation_id: segment.confirmation_id, decision, trace: ui.trace.checked };
  if (decision === "approve" && !sameJSON(argumentsText, segment.proposed)) {
    try {
      body.arguments = JSON.parse(argumentsText);
    } catch (error) {
      segment.problem = `The arguments are not JSON: ${error.message}`;
      return drawSegment(segment);
    }
  }
  segment.decision = "sending";
  segment.problem = "";
  drawSegment(segment);
  let response;
  try {
    response = await api("POST", `${conversationPath(current)}/resume`, { body, stream: true });
  } catch (error) {
    segment.decision = error.status === 400 ? "pending" : "closed";
    segment.problem = error.message;
    return drawSegment(segment);
  }
  segment.decision = decision;
  if (body.arguments) segment.arguments = JSON.stringify(body.arguments);
  delete segment.edited;
  startLive(current, null);
  // The decided calls run (or are declined) in this turn: it keeps them, for a reload.
  for (const call of calls.values()) {
    if (["approve", "reject"].includes(call.decision) && !call.result) live.segments.push(call);
  }
  saveLive();
  drawSegment(segment);
  if (hintShown === "waiting" && !waitingCall()) hideHint();
  await runTurn(async () => response);
}

// The Undo button: the last change to the house put back, by a turn of its own.
async function undoLast(segment) {
  if (live || sending) return;
  sending = true;
  let response;
  try {
    response = await api("POST", `${conversationPath(current)}/undo`, { body: { trace: ui.trace.checked }, stream: true });
  } catch (error) {
    segment.problem = error.message;
    return drawSegment(segment);
  } finally {
    sending = false;
  }
  segment.problem = "";
  drawSegment(segment);
  startLive(current, "Undo that.");
  await runTurn(async () => response);
}

async function cancel() {
  if (!live?.turnId) return;
  ui.cancel.disabled = true;
  await api("POST", `v1/turns/${encodeURIComponent(live.turnId)}/cancel`).catch(() => {});
}

// The call of the open conversation that waits for the user's decision, if one does.
function waitingCall() {
  return [...calls.values()].find((call) => call.decision === "pending");
}

// -- the hint beside the message box -------------------------------------------------------

let hintShown = null; // "waiting" (a decision) or "running" (a turn started elsewhere)

const HINTS = {
  waiting: "A tool call above waits for your decision: approve or reject it, then send your message (it stays here).",
  running: "An answer is still coming in this conversation (from another tab or device): your message stays here until it ends.",
};

function showHint(kind) {
  hintShown = kind;
  ui.hintText.textContent = HINTS[kind];
  ui.hintReject.hidden = kind !== "waiting";
  ui.hint.hidden = false;
}

function hideHint() {
  hintShown = null;
  ui.hint.hidden = true;
}

// As a voice user answers "no, dim it to 30 %": decline the waiting call, then send.
async function rejectAndSend() {
  const call = waitingCall();
  const text = ui.input.value.trim();
  if (!call || !text) return;
  await decide(call, "reject", "");
  if (!waitingCall() && !live) await send(text, { fromBox: true });
}

// -- the first screen: what this deployment's tools can do ---------------------------------

// Prompts that exercise one tool each, shown when the server has that tool (`GET /v1/tools`).
const SUGGESTIONS = [
  ["ha_call_service", "Turn on the kitchen lights"],
  ["plex_now_playing", "What is playing on Plex right now?"],
  ["weather", "Will it rain in Paris tomorrow?"],
  ["set_timer", "Set a timer for 10 minutes for the pasta"],
  ["save_note", "Remember that the spare key is under the blue pot"],
  ["wikipedia", "Who was Ada Lovelace?"],
  ["web_search", "Search the web for this week's Debian news"],
  ["calculator", "What is 17.5 % of 2,340?"],
  ["get_time", "What time is it in Tokyo?"],
];
const MAX_SUGGESTIONS = 4;
let toolNames = null; // the deployment's tools, once asked

async function loadTools() {
  try {
    toolNames = new Set((await getJSON("v1/tools")).data.map((tool) => tool.name));
  } catch {
    toolNames = new Set();
  }
}

function suggestions() {
  const fit = SUGGESTIONS.filter(([tool]) => toolNames?.has(tool)).map(([, text]) => text);
  return fit.length ? fit.slice(0, MAX_SUGGESTIONS) : ["Tell me a fun fact about otters"];
}

function showWelcome() {
  if (current || live || ui.log.children.length || !toolNames) return;
  const box = el("div", "welcome");
  box.append(el("h2", "", "What can I do for you?"), el("p", "", "Try one of these, or write your own below."));
  const grid = el("div", "suggestions");
  for (const text of suggestions()) {
    const button = el("button", "suggestion", text);
    button.type = "button";
    button.addEventListener("click", () => {
      box.remove();
      send(text).catch((error) => notice(error.message, "error"));
    });
    grid.append(button);
  }
  box.append(grid);
  ui.log.append(box);
}

// -- the footer: the deployment as the server describes it (`GET /v1/status`) ---------------

const STATUS_EVERY_MS = 30_000;
const STATUS_NO_WORKER_MS = 5_000; // sooner while no worker is alive: one may be starting

async function watchStatus() {
  for (;;) {
    let wait = STATUS_EVERY_MS;
    try {
      const status = await getJSON("v1/status");
      drawStatusBar(status);
      if (!status.workers.alive) wait = STATUS_NO_WORKER_MS;
    } catch (error) {
      if (error.status === 401) return; // starts again once a key is saved
    }
    await sleep(wait);
  }
}

function drawStatusBar(status) {
  const parts = [];
  const byModel = new Map();
  for (const model of status.models) {
    byModel.set(model.model, [...(byModel.get(model.model) ?? []), model]);
  }
  if (!status.models.length) parts.push(["no worker has said which models it runs", "warn"]);
  for (const [name, models] of byModel) {
    const demo = models.some((m) => m.demo);
    const roles = models.map((m) => m.role).join(", ");
    parts.push([demo ? `${name}: offline demo model (${roles})` : `${name} (${roles})`, ""]);
    const silent = models.find((m) => m.probe && !m.probe.reachable);
    if (silent) parts.push([`${name} does not answer: ${silent.probe.detail}`, "warn"]);
  }
  const alive = status.workers.alive;
  if (alive === null) parts.push(["workers unknown: the queue's Redis did not answer", "warn"]);
  else if (alive === 0) parts.push(["no worker alive: answers wait", "warn"]);
  else parts.push([`${alive} worker${alive === 1 ? "" : "s"} alive`, ""]);
  parts.push([`Bernard ${status.version}`, ""]);
  const nodes = [];
  parts.forEach(([text, className], index) => {
    if (index) nodes.push(" · ");
    nodes.push(el("span", className, text));
  });
  ui.status.replaceChildren(...nodes);
  ui.status.title = ui.status.textContent;
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

// A conversation is listed under its title (`title`, made by the server, or one a client
// set in its metadata), else the start of its first message, never its id.
const PREVIEW_CHARS = 80;
const PREVIEWS_PER_REFRESH = 20;
const previews = new Map(); // conversation id -> the start of its first message

function preview(text) {
  const line = text.replace(/\s+/g, " ").trim();
  return line.length > PREVIEW_CHARS ? `${line.slice(0, PREVIEW_CHARS - 1)}…` : line;
}

function conversationTitle(conversation) {
  return conversation.title || conversation.metadata?.title || previews.get(conversation.id)
    || (conversation.message_count ? "Untitled conversation" : "New conversation");
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
  fillPreviews(page.data); // the list is usable meanwhile
}

// The first message of each listed conversation that has no title, once per page load.
async function fillPreviews(conversations) {
  const untitled = conversations.filter((c) => !c.title && !c.metadata?.title && c.message_count && !previews.has(c.id));
  for (const conversation of untitled.slice(0, PREVIEWS_PER_REFRESH)) {
    if (previews.has(conversation.id)) continue;
    previews.set(conversation.id, "");
    try {
      const [first] = (await getJSON(`${conversationPath(conversation.id)}/messages?limit=1`)).data;
      if (first?.role === "user") previews.set(conversation.id, preview(rowText(first)));
    } catch {
      continue;
    }
    const label = [...ui.list.children].find((item) => item.dataset.id === conversation.id)?.querySelector(".open");
    if (label) label.textContent = conversationTitle(conversation);
  }
}

function listItem(conversation) {
  const item = el("li");
  item.dataset.id = conversation.id;
  const open = el("button", "open", conversationTitle(conversation));
  open.type = "button";
  open.title = `${conversation.id} · ${conversation.message_count} messages · ${conversation.status}`;
  open.addEventListener("click", () => {
    setDrawer(false);
    openConversation(conversation.id);
  });
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
  setDrawer(false);
  setCurrent(null);
  nodes = new Map();
  calls = new Map();
  ui.log.replaceChildren();
  hideHint();
  showWelcome();
  ui.input.focus();
}

// On a narrow screen the conversations are a drawer (style.css), opened by the menu button.
function setDrawer(open) {
  document.body.classList.toggle("drawer-open", open);
  ui.backdrop.hidden = !open;
  ui.menu.setAttribute("aria-expanded", String(open));
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
  calls = new Map();
  ui.log.replaceChildren();
  if (hintShown === "waiting") hideHint();
  const joined = conversation.status === "running" && conversation.turn_id && !live;
  if (joined) {
    // Its events do not hold the user's message: that comes from its stored rows.
    const asked = rows.filter((row) => row.turn_id === conversation.turn_id && row.role === "user");
    live = { conversationId: id, turnId: conversation.turn_id, lastEventId: null, segments: [] };
    asked.forEach((row) => live.segments.push({ kind: "user", text: rowText(row) }));
    saveLive();
    setBusy(true);
  }
  // The live turn's calls are its own (drawn with it, below), not its stored rows'.
  for (const segment of live?.segments ?? []) if (segment.kind === "call") calls.set(segment.id, segment);
  drawRows(rows.filter((row) => !live || row.turn_id !== live.turnId), conversation);
  if (live) live.segments.forEach(drawSegment);
  if (joined) await reattach();
}

function rowText(row) {
  return typeof row.content === "string" ? row.content : (row.content || []).map((part) => part.text || "").join("");
}

// What the worker tells the model of a call the user rejected (worker/harness/resume.py).
const DECLINED = "The user declined:";
// How the `undo` tool's result starts when it put a change back (worker/tools/home_assistant.py).
const UNDONE = "Undone:";

function drawRows(rows, conversation) {
  let lastCalls = [];
  for (const row of rows) {
    const text = rowText(row);
    if (row.role === "user") drawSegment({ kind: "user", text });
    else if (row.role === "assistant") {
      if (text) drawSegment({ kind: "text", text });
      // An answer its turn did not finish, as far as it went: say why it stops there.
      if (row.stopped) drawSegment({ kind: "status", text: STOPPED_BY[row.stopped] || STOPPED });
      if (row.tool_calls?.length) lastCalls = [];
      for (const call of row.tool_calls || []) {
        if (calls.has(call.id)) continue; // the live turn shows it
        const segment = { ...newCall({ id: call.id, name: call.function.name, arguments: call.function.arguments }), progress: null, stored: true };
        calls.set(call.id, segment);
        lastCalls.push(segment);
        drawSegment(segment);
      }
    } else if (row.role === "tool") {
      const segment = calls.get(row.tool_call_id);
      if (!segment?.stored) continue;
      if (text.startsWith(DECLINED)) segment.decision = "reject";
      segment.result = { output: text, is_error: false };
      if (segment.name === "undo" && text.startsWith(UNDONE)) markUndone();
      drawSegment(segment);
    }
  }
  redrawChanges(); // the Undo button on the last change only
  if (conversation.status !== "awaiting_confirmation" || live) return;
  // The last step's calls without a result wait for decisions: the first one offered
  // (`pending_confirmation`) in its own card, the others after it.
  const pending = conversation.pending_confirmation;
  for (const segment of lastCalls) {
    if (segment.result) continue;
    segment.decision = "waiting";
    drawSegment(segment);
  }
  if (!pending) return;
  const proposal = { confirmation_id: pending.confirmation_id, summary: pending.summary, proposed: pending.tool_call.arguments, decision: "pending" };
  const segment = calls.get(pending.tool_call.id);
  if (segment) {
    Object.assign(segment, proposal);
    drawSegment(segment);
  } else {
    const added = { ...newCall(pending.tool_call), ...proposal, progress: null };
    calls.set(added.id, added);
    drawSegment(added);
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
    await sleep(2000);
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
let watchingStatus = false;

async function start() {
  await refreshList();
  if (!ui.keybox.hidden) return; // a 401: wait for the key
  if (!watching) {
    watching = true;
    watchEvents().finally(() => (watching = false));
  }
  if (!watchingStatus) {
    watchingStatus = true;
    watchStatus().finally(() => (watchingStatus = false));
  }
  if (!toolNames) await loadTools();
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
  showWelcome(); // unless a conversation is open
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
    if (!text || live || sending) return;
    if (waitingCall()) return showHint("waiting"); // the text stays in the box
    send(text, { fromBox: true }).catch((error) => notice(error.message, "error"));
  });
  ui.input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("#composer").requestSubmit();
    }
  });
  ui.cancel.addEventListener("click", cancel);
  ui.hintReject.addEventListener("click", () => rejectAndSend().catch((error) => notice(error.message, "error")));
  ui.menu.addEventListener("click", () => setDrawer(!document.body.classList.contains("drawer-open")));
  ui.backdrop.addEventListener("click", () => setDrawer(false));
  $("#close-drawer").addEventListener("click", () => setDrawer(false));
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && document.body.classList.contains("drawer-open")) setDrawer(false);
  });
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
