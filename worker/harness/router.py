"""The router harness: decides which tools the answer needs, runs them, streams it all.

Per model call: one `llm_prompt` trace, the call itself with the tools bound plus `respond`,
one `llm_call_complete` trace.

When the roles share a model (`Settings.roles_share_model`, decided there once), the router
is the agent loop a single model runs: each step streams, with the response model's system
prompt and no `respond`; its text reaches the client as `delta`s the moment it comes (text
written before a step's tool calls too, so a voice satellite speaks while the tool runs),
and a step that writes text and calls no tool is the answer, so the response harness calls
nothing. A turn that needs no tool makes one model call; a one-tool turn two. A step that
wrote only whitespace and called no tool leaves the answer to the response model. With two
models, the router is asked to call `respond` beside its last tool calls when their results
suffice, and the turn then goes to the response model as soon as they have run.

For each tool call except `respond`: `tool_call` (before the tool runs, arguments whole),
the tool's `tool_progress` events live while it runs, then `tool_result` (cut for the
stream; the context keeps it whole for the response model and the record keeper). The loop
ends when the model calls `respond` or calls no tool, or after `max_router_steps` model
calls (then a non-fatal `error` event, and the turn goes on to the response with what it
has).

Before a call runs the policy rules on it (worker/tools/policy.py, the one place that
decides): it runs, is refused (a user's rules keep them from it: never asked), or waits. A
call that waits does not run: the router checks what the tool can check before it runs (a
call it refuses is answered with its error, like any failed call), says its question in
words (`delta`s, one sentence per call: shared/confirmation_words.py; the step's stored
message holds what the user read), yields `awaiting_confirmation` for the others (after
running the step's other calls), keeps the proposals on the context and stops; the turn
ends there, and the user's decision continues the conversation as a new turn
(worker/harness/resume.py). A decision in words that is the router's to read is read in
that turn's first step (worker/harness/answers.py), and carried out as any decision is
(`carry_out`). When every such call was refused, the router goes on: the model reads why.
At most
`BERNARD_MAX_PENDING_CONFIRMATIONS_PER_CONVERSATION` calls of a step wait, and no more than
the user's `BERNARD_MAX_PENDING_CONFIRMATIONS_PER_USER` across conversations allows
(shared/budgets.py); the others are refused the same way.

The client's own function tools (`AgentRequest.client_tools`) are offered beside Bernard's
as its `tool_choice` asks (worker/harness/client_calls.py). Bernard never runs one: when
the model calls client tools, the step's own calls run as usual, then the router yields one
`client_tool_call` per client call (their `index` 0, 1, ... in the model's order) and stops
with finish_reason "tool_calls"; no answer is written. The step's message, the client's
calls in it, is stored like any other; the client's follow-up sends the calls back (which
shared/records/history_diff.py knows by their ids) with a `tool` message for each, and the
next turn's router reads them and goes on.

`respond` is the router's way of saying "I have what I need": it is never streamed, and it
is left out of the messages the response model sees, since an assistant tool call without a
tool answer is an invalid prompt.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from typing import Any

from langchain_core.messages import AIMessage, SystemMessage, ToolMessage
from langchain_core.messages.tool import tool_call
from langchain_core.tools import BaseTool

from shared import budgets
from shared.client_tools import RESPOND_TOOL_NAME
from shared.confirmation_words import question
from shared.errors import ErrorCode
from shared.events import (
    AwaitingConfirmation,
    ClientToolCall,
    Delta,
    Error,
    LlmCallComplete,
    LlmPrompt,
    ToolCall,
    ToolResult,
)
from worker.calls import Item, ModelCallEnded, ModelCallStarted, ToolCallEnded
from worker.context import Proposal, TurnContext
from worker.harness.answers import Waiting, decided_call, declined
from worker.harness.client_calls import ClientOffer
from worker.harness.tool_call import (
    PlannedCall,
    arguments_text,
    check,
    cut_for_stream,
    execute,
    problem_with,
)
from worker.tools.confirmation import parameters
from worker.tools.policy import PolicyVerdict, Ruling, rule_on

__all__ = [
    "RESPOND_TOOL",
    "RESPOND_TOOL_NAME",
    "ROUTER_PROMPT",
    "carry_out",
    "pause",
    "propose",
    "room_to_wait",
    "router_harness",
    "rule",
    "run_call",
]

RESPOND_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": RESPOND_TOOL_NAME,
        "description": "Call when you are ready for the final answer to be written",
        "parameters": {"type": "object", "properties": {}},
    },
}

ROUTER_PROMPT = (
    "You are the router of Bernard, an assistant. Do not answer the user yourself: decide "
    "which tools, if any, would help answer the latest message, and call them. Tool results "
    "come back to you; call more tools if needed. When you have what the answer needs, or "
    f"when no tool helps, call `{RESPOND_TOOL_NAME}` and another model will write the answer. "
    "When the tools you call now are all the answer needs, call "
    f"`{RESPOND_TOOL_NAME}` beside them, in the same step: the answer is then written as soon "
    "as they have run."
)


async def router_harness(ctx: TurnContext) -> AsyncGenerator[Item, None]:
    """Run the tool loop for `ctx`, yielding each event the moment it happens."""
    tools = {tool.name: tool for tool in ctx.tools}
    offer = ClientOffer.of(ctx.request, tools)
    model = ctx.router.name
    steps = ctx.settings.max_router_steps
    # One model for both roles: each step streams, its text is the answer, and there is no
    # `respond` (a step that calls no tool has answered). Else the router's own prompt, and
    # its answers whole.
    answers = ctx.settings.roles_share_model
    respond = None if answers else RESPOND_TOOL
    # The calls the user's words answer, when the router reads them (worker/harness/answers.py):
    # in front of its first step only.
    answering = Waiting.of(ctx.request)
    for step in range(steps):
        bound, options = offer.binding(ctx.tools, respond, last_step=step == steps - 1)
        if answers:
            # The response model's own prompt, the same on every call of the conversation,
            # so an upstream that caches prompt prefixes reuses it (worker/harness/memory.py).
            messages = [*ctx.system(), *ctx.memory, *ctx.history, *ctx.tool_messages]
        else:
            messages = [SystemMessage(ROUTER_PROMPT), *ctx.memory, *ctx.history]
            messages += ctx.tool_messages
        if answering is not None:
            bound = [*bound, *answering.tools]
            messages += answering.prompt()
        prompt = LlmPrompt(stage="router", model=model, messages=ctx.traced(messages))
        yield ModelCallStarted(prompt, messages)
        step_first = len(ctx.content)  # where this step's text begins
        if answers:
            streamed = ctx.router.stream(messages, ctx.request.sampling(), bound, options)
            # Whitespace the model writes before anything else is held back: a step that
            # writes only that and calls no tool has not answered (the response model then
            # does), and one that goes on to words sends it with the first of them.
            held: str | None = ""
            async with aclosing(streamed):
                async for text in streamed:
                    if not isinstance(text, str):
                        continue  # a tool call, whole: the step's message has them all
                    if held is not None:
                        if text.isspace():
                            held += text
                            continue
                        text, held = held + text, None
                        if ctx.calls_before_text is None:
                            ctx.calls_before_text = len(ctx.tool_calls)
                    ctx.content.append(text)
                    yield Delta(text=text)
            result = streamed.result
            spoke = held is None
        else:
            result = await ctx.router.complete(messages, bound, options)
            spoke = False
        ctx.add_usage(result.usage)
        complete = LlmCallComplete(
            stage="router", model=model, latency_ms=result.latency_ms, usage=result.usage
        )
        yield ModelCallEnded(complete, result)
        message, ran = result.message, False
        if answering is not None:
            # The step answered the waiting calls: they are carried out first, their results
            # right after the paused turn's message, then the user's words.
            decisions, message = answering.decide(message)
            async with aclosing(carry_out(ctx, decisions, tools)) as events:
                async for event in events:
                    yield event
            ctx.tool_messages.extend(answering.words)
            ran = any(d["decision"] == "approve" for d in decisions)
            answering = None
        planned, responded = _plan(message)
        if spoke and not planned and not ran:
            # The answer, written as it streamed: nothing is left to call.
            ctx.answered = True
            if result.finish_reason:
                ctx.finish_reason = result.finish_reason
            return
        own, handed = offer.split(planned)
        if planned:
            # The client's calls are in the step's message: the records store it as it is,
            # and the client's follow-up carries their results (worker/recording.py). Text
            # written before the calls stays on it: the answer starts after it.
            kept = [*own, *handed]
            calls = [tool_call(name=c.name, args=c.args, id=c.id) for c in kept]
            step_message = AIMessage(content=message.content, tool_calls=calls)
            ctx.tool_messages.append(step_message)
            ctx.answer_start = len(ctx.content)
            rulings = [await rule(ctx, call, tools) for call in own]
            waiting = [
                c for c, r in zip(own, rulings, strict=True) if r and r.verdict is PolicyVerdict.ASK
            ]
            for call, ruling in zip(own, rulings, strict=True):
                if call not in waiting:
                    refused = _misread(call, offer) or (ruling.refusal if ruling else None)
                    running = run_call(ctx, call, tools, refused, ruling)
                    async with aclosing(running) as events:
                        async for event in events:
                            yield event
            proposals: list[Proposal] = []
            room, why = await room_to_wait(ctx) if waiting and not handed else (0, "")
            for call in waiting:
                if handed:  # the turn ends on the client's calls: nobody is asked
                    refusal = "not run: the turn ended on the client's tool calls; call it again"
                    async with aclosing(run_call(ctx, call, tools, refusal)) as events:
                        async for event in events:
                            yield event
                    continue
                if len(proposals) >= room:  # over a budget, or none: refused unchecked
                    refusal = f"not run: {why}"
                    async with aclosing(run_call(ctx, call, tools, refusal)) as events:
                        async for event in events:
                            yield event
                    continue
                # Asked only about a call that can run: what the tool can check before it
                # runs is checked now, and a call it refuses is answered like any failed call.
                checked = await check(
                    call,
                    tools[call.name],
                    timeout_s=ctx.settings.tool_timeout_s,
                    runtime=ctx.runtime,
                )
                if checked.summary is None:
                    async with aclosing(run_call(ctx, call, tools, checked.problem)) as events:
                        async for event in events:
                            yield event
                    continue
                proposals.append(propose(ctx, call, tools[call.name], checked.summary))
            if handed:
                # The client runs its own tools: the turn ends here, without an answer, and
                # the client's follow-up carries the results (the router then goes on).
                for index, call in enumerate(handed):
                    ctx.client_calls.append(
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments},
                        }
                    )
                    yield ClientToolCall(
                        id=call.id, name=call.name, arguments=call.arguments, index=index
                    )
                ctx.finish_reason = "tool_calls"
                return
            if proposals:
                # Tools that change the world run only once the user decides: the turn
                # pauses here, its read tools done, and a decision resumes it as a new turn.
                async with aclosing(pause(ctx, proposals, step_message, step_first)) as events:
                    async for event in events:
                        yield event
                return
        if responded or not planned:
            return
    yield Error(
        message=(
            f"the router reached its limit of {ctx.settings.max_router_steps} model calls; "
            "answering with the tool results so far"
        ),
        code=ErrorCode.ROUTER_STEP_LIMIT,
    )


def _misread(call: PlannedCall, offer: ClientOffer) -> str | None:
    """Why a client tool's call runs here after all: its arguments are not a JSON object
    (`ClientOffer.split`), which the model reads as the call's result."""
    if call.name in offer.names and call.parse_error is not None:
        return f"invalid arguments for tool '{call.name}': {call.parse_error}"
    return None


async def rule(ctx: TurnContext, call: PlannedCall, tools: Mapping[str, BaseTool]) -> Ruling | None:
    """What the policy says of `call` for the turn's user; None for a call that cannot run
    (an unknown tool, arguments that fail its schema): it runs at once, to an error the
    model can act on."""
    if problem_with(call, tools) is not None:
        return None
    return await rule_on(tools[call.name], call.args, settings=ctx.settings, runtime=ctx.runtime)


async def room_to_wait(ctx: TurnContext) -> tuple[int, str]:
    """How many of a step's calls may wait for the user's decision, and why no more."""
    if not ctx.request.kept:
        return 0, (
            "this turn is kept in no conversation (store: false), so nobody can confirm a "
            "call that changes the world; it can be asked for in a stored response"
        )
    settings = ctx.settings
    room = settings.max_pending_confirmations_per_conversation
    why = (
        f"at most {room} tool calls may wait for the user's decision at once "
        "(BERNARD_MAX_PENDING_CONFIRMATIONS_PER_CONVERSATION); ask for it again once those "
        "are decided"
    )
    if ctx.runtime is not None:
        held = await budgets.pending_confirmation_count(ctx.runtime.redis, ctx.runtime.owner)
        cap = settings.max_pending_confirmations_per_user
        if cap - held < room:
            room = max(0, cap - held)
            why = (
                f"the user has {held} tool calls waiting for a decision already, and may "
                f"have {cap} (BERNARD_MAX_PENDING_CONFIRMATIONS_PER_USER); ask for it again "
                "once those are decided"
            )
    return room, why


async def pause(
    ctx: TurnContext, proposals: Sequence[Proposal], message: AIMessage, first: int
) -> AsyncGenerator[Item, None]:
    """Pause the turn on `proposals`: its question in words (after what the turn said so
    far), so that every client shows it and a voice pipeline speaks it, then each
    `awaiting_confirmation`. `message` is the step's tool-call message, which keeps what
    the user read of the step (its text from `first` in `ctx.content`, and the question)."""
    asked = question([p.summary for p in proposals], ctx.request.language)
    said = "".join(ctx.content)
    if said and not said[-1].isspace():
        asked = "\n\n" + asked
    if ctx.calls_before_text is None:  # where the Responses API's message sits
        ctx.calls_before_text = len(ctx.tool_calls)
    ctx.content.append(asked)
    yield Delta(text=asked)
    message.content = "".join(ctx.content[first:]).strip()
    for proposal in proposals:
        ctx.pending.append(proposal)
        yield AwaitingConfirmation(**proposal.public())


def propose(ctx: TurnContext, call: PlannedCall, tool: BaseTool, said: str) -> Proposal:
    return Proposal(
        confirmation_id=f"conf_{uuid.uuid4().hex}",
        turn_id=ctx.turn_id,
        tool_call={"id": call.id, "name": call.name, "arguments": call.arguments},
        summary=said,
        expires_at=time.time() + ctx.settings.confirmation_ttl_s,
        parameters=parameters(tool),
    )


async def carry_out(
    ctx: TurnContext, decisions: Sequence[Mapping[str, Any]], tools: Mapping[str, BaseTool]
) -> AsyncGenerator[Item, None]:
    """The user's decisions on a paused turn's calls, however they came (`POST .../resume`,
    an approval item, words): each approved call runs (`run_call`: its checks, progress and
    result), each rejected one is answered that the user declined."""
    for decision in decisions:
        call = decided_call(decision)
        if decision["decision"] == "approve":
            # Ruled on again (worker/tools/policy.py): an approval never runs a call the
            # user's rules refuse, nor an edited one they would.
            ruling = await rule(ctx, call, tools)
            refused = ruling.refusal if ruling is not None else None
            async with aclosing(run_call(ctx, call, tools, refused, ruling)) as events:
                async for event in events:
                    yield event
            continue
        content = declined(call.name)
        ctx.tool_messages.append(ToolMessage(content=content, tool_call_id=call.id, name=call.name))
        ctx.tool_outputs.append({"id": call.id, "name": call.name, "content": content})
        yield ToolResult(tool_call_id=call.id, name=call.name, content=content)


async def run_call(
    ctx: TurnContext,
    call: PlannedCall,
    tools: Mapping[str, BaseTool],
    refused: str | None = None,
    ruling: Ruling | None = None,
) -> AsyncGenerator[Item, None]:
    """One call: `tool_call`, its progress live, `tool_result` (and `error` if it failed);
    with `refused`, the call ends in that error without running (tool_call.py `execute`).
    `ruling`, the policy's, is shown on the `tool_call` (and so in the call log)."""
    # The index counts calls across the whole turn, so clients that merge `delta.tool_calls`
    # by index never fold two router steps' calls into one.
    index = len(ctx.tool_calls)
    policy = ruling.shown() if ruling is not None else None
    ctx.tool_calls.append({"id": call.id, "name": call.name, "arguments": call.arguments})
    started = ToolCall(
        id=call.id, name=call.name, arguments=call.arguments, index=index, policy=policy
    )
    yield started
    running = execute(
        call, tools, timeout_s=ctx.settings.tool_timeout_s, runtime=ctx.runtime, refused=refused
    )
    async with aclosing(running):
        async for progress in running:
            yield progress
    outcome = running.result
    ctx.tool_messages.append(outcome.message)
    ctx.tool_outputs.append({"id": call.id, "name": call.name, "content": outcome.content})
    streamed, truncated = cut_for_stream(outcome.content, ctx.settings.stream_tool_output_max_chars)
    shown = ToolResult(
        tool_call_id=call.id,
        name=call.name,
        content=streamed,
        truncated=truncated,
        index=index,
        is_error=outcome.status == "error",
    )
    yield ToolCallEnded(started, shown, outcome)


def _plan(message: AIMessage) -> tuple[list[PlannedCall], bool]:
    """The calls to run (in the model's order, `respond` left out) and whether it responded."""
    planned: list[PlannedCall] = []
    responded = False
    for call in message.tool_calls:
        if call["name"] == RESPOND_TOOL_NAME:
            responded = True
            continue
        args = call["args"]
        planned.append(
            PlannedCall(
                id=call.get("id") or _new_id(),
                name=call["name"],
                args=args,
                arguments=arguments_text(args),
            )
        )
    # Arguments that are not a JSON object land here; the model hears about it as the
    # call's result, and its own text is what the client sees as the arguments.
    for bad in message.invalid_tool_calls:
        name = bad.get("name") or ""
        if name == RESPOND_TOOL_NAME:
            responded = True
            continue
        raw = bad.get("args") or ""
        planned.append(
            PlannedCall(
                id=bad.get("id") or _new_id(),
                name=name,
                args={},
                arguments=raw,
                parse_error=f"the arguments are not a JSON object: {raw[:200]!r}",
            )
        )
    return planned, responded


def _new_id() -> str:
    # Some providers omit call ids; the tool message and the stream need one to match on.
    return f"call_{uuid.uuid4().hex[:24]}"
