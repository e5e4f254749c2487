"""Bernard as a conversation agent of Home Assistant's Assist.

Each utterance is a message in its device's Bernard conversation (routing.py). Bernard's
answer streams into the chat log as it arrives (the pipeline passes each delta on, so a
satellite's text-to-speech can start early); its tool calls and results land in the chat
log too (relay.py), and each step of a tool's progress in the conversation's trace, which is
where the pipeline's debug view shows them.

When Bernard pauses a turn for the user's confirmation, it says its question in words (in
the language the agent names, `Accept-Language`), which the agent speaks, and the agent
keeps the conversation open; the next utterance goes to the same conversation as any
does, and Bernard reads it as the answer ("yes", "no", "no, dim it to 30 percent"). Any
failure is a short spoken apology and one logged line that says why, never a stack trace.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Literal

from homeassistant.components import assist_pipeline, conversation
from homeassistant.const import MATCH_ALL
from homeassistant.core import HomeAssistant
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers import intent
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .client import (
    BernardClient,
    BernardError,
    BernardEvent,
    Confirmation,
    TextDelta,
    ToolCall,
    ToolProgress,
    ToolResult,
    TurnDone,
    TurnError,
)
from .const import ANSWER_S, CONF_LANGUAGE, DOMAIN, LOGGER
from .languages import phrases_for
from .relay import ToolRelay
from .runtime import BernardConfigEntry

# What a tool call Bernard did not answer in this turn shows as its result.
NO_RESULT = {"status": "not run in this turn"}


async def async_setup_entry(
    hass: HomeAssistant,
    entry: BernardConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    async_add_entities([BernardAgent(entry)])


class Unanswered(Exception):
    """The turn cannot go on: `speech` is what the user hears instead."""

    def __init__(self, speech: str, reason: str) -> None:
        super().__init__(reason)
        self.speech = speech
        self.reason = reason


class _Heard:
    """What one turn's events said, and the chat log deltas each makes."""

    def __init__(self, chat_log: conversation.ChatLog, relay: ToolRelay) -> None:
        self.chat_log = chat_log
        self.relay = relay
        self.text: list[str] = []
        self.pending: Confirmation | None = None
        self.done: TurnDone | None = None
        self._message_open = False  # an assistant message has started
        self._calls_open = False  # ... and holds tool calls: the answer starts a new one

    def take(self, event: BernardEvent) -> list[conversation.AssistantContentDeltaDict]:
        match event:
            case TextDelta(text=text):
                self.text.append(text)
                if self._message_open and not self._calls_open:
                    return [{"content": text}]
                # The chat log waits for the open message's tool results before it starts
                # the next: those Bernard did not send are closed first.
                self.relay.close(NO_RESULT)
                self._message_open, self._calls_open = True, False
                return [{"role": "assistant"}, {"content": text}]
            case ToolCall():
                tool_input = self.relay.call(event.id, event.name, event.arguments)
                start: list[conversation.AssistantContentDeltaDict] = (
                    [] if self._message_open else [{"role": "assistant"}]
                )
                self._message_open = self._calls_open = True
                return [*start, {"tool_calls": [tool_input]}]
            case ToolResult():
                result = {"output": event.output, "is_error": event.is_error}
                self.relay.resolve(event.tool_call_id, result)
            case ToolProgress():
                # No chat log content holds a step: it goes to the trace, and as a delta of
                # its own to whoever follows the chat log (the pipeline's debug view).
                progress = {"tool_call_id": event.tool_call_id, "message": event.message}
                self.chat_log.async_trace({"tool_progress": progress})
                if self.chat_log.delta_listener is not None:
                    self.chat_log.delta_listener(self.chat_log, {"tool_progress": progress})
            case Confirmation():
                self.pending = event
            case TurnError():
                self.chat_log.async_trace({"error": {"code": event.code}})
            case TurnDone():
                self.done = event
        return []


class BernardAgent(conversation.ConversationEntity, conversation.AbstractConversationAgent):
    """One Bernard server (a config entry) as an Assist conversation agent."""

    _attr_has_entity_name = True
    _attr_name = None
    # Home Assistant 2025.4 hands every chat log delta to the pipeline's listeners; later
    # releases also start text-to-speech on the first words of an agent that says it streams.
    _attr_supports_streaming = True

    def __init__(self, entry: BernardConfigEntry) -> None:
        self.entry = entry
        self._attr_unique_id = entry.entry_id
        self._attr_device_info = dr.DeviceInfo(
            identifiers={(DOMAIN, entry.entry_id)},
            name=entry.title,
            manufacturer="Bernard",
            model="Conversation agent",
            entry_type=dr.DeviceEntryType.SERVICE,
        )

    @property
    def supported_languages(self) -> Literal["*"]:
        return MATCH_ALL

    async def async_added_to_hass(self) -> None:
        await super().async_added_to_hass()
        assist_pipeline.async_migrate_engine(
            self.hass, "conversation", self.entry.entry_id, self.entity_id
        )
        conversation.async_set_agent(self.hass, self.entry, self)

    async def async_will_remove_from_hass(self) -> None:
        conversation.async_unset_agent(self.hass, self.entry)
        await super().async_will_remove_from_hass()

    async def _async_handle_message(
        self,
        user_input: conversation.ConversationInput,
        chat_log: conversation.ChatLog,
    ) -> conversation.ConversationResult:
        household = self.entry.runtime_data.household
        client = self.entry.runtime_data.client
        language = self.entry.options.get(CONF_LANGUAGE) or user_input.language
        phrases = phrases_for(language)
        bernard_id = household.conversation_for(user_input.device_id, user_input.context.user_id)
        relay = ToolRelay(
            self.hass, user_input.context, language, user_input.device_id, user_input.text
        )
        chat_log.llm_api = relay.instance
        try:
            async with asyncio.timeout(ANSWER_S):
                events = self._events(client, bernard_id, user_input.text, language)
                heard = await self._stream(user_input.agent_id, chat_log, relay, events)
        except Unanswered as err:
            LOGGER.info("Bernard conversation %s: %s", bernard_id, err.reason)
            return _apology(user_input, chat_log, err.speech)
        except BernardError as err:
            LOGGER.warning("Bernard did not answer (conversation %s): %s", bernard_id, err.reason)
            return _apology(user_input, chat_log, phrases.sorry)
        except TimeoutError:
            LOGGER.warning(
                "Bernard did not answer within %s s (conversation %s)", ANSWER_S, bernard_id
            )
            return _apology(user_input, chat_log, phrases.sorry)
        finally:
            relay.close(NO_RESULT)

        said = "".join(heard.text).strip()
        assert heard.done is not None  # the client ends every turn with `done` or raises
        if heard.pending is not None:
            # Bernard asked its question in words: the next utterance answers it.
            return _result(user_input, chat_log, said, keep_open=True)
        if heard.done.interrupted:
            # What it said until the next utterance stopped it; that one is answered.
            return _result(user_input, chat_log, said)
        if not heard.done.succeeded:
            LOGGER.warning(
                "Bernard's turn ended %s (%s) in conversation %s",
                heard.done.status,
                heard.done.error_code,
                bernard_id,
            )
            return _apology(user_input, chat_log, phrases.failed, after=said)
        return _result(user_input, chat_log, said)

    async def _events(
        self, client: BernardClient, bernard_id: str, text: str, language: str
    ) -> AsyncIterator[BernardEvent]:
        """The events of the turn this utterance starts (Bernard reads it as the answer
        when its conversation waits on one)."""
        try:
            async for event in client.send(bernard_id, text, language):
                yield event
        except BernardError as err:
            if err.code != "conversation_busy":
                raise
            raise Unanswered(phrases_for(language).busy, "a turn is still running") from None

    async def _stream(
        self,
        agent_id: str,
        chat_log: conversation.ChatLog,
        relay: ToolRelay,
        events: AsyncIterator[BernardEvent],
    ) -> _Heard:
        """Stream a turn's events into the chat log; what they said."""
        heard = _Heard(chat_log, relay)

        async def deltas() -> AsyncIterator[conversation.AssistantContentDeltaDict]:
            try:
                async with aclosing(events) as stream:
                    async for event in stream:
                        for delta in heard.take(event):
                            yield delta
            finally:
                relay.close(NO_RESULT)

        async for _content in chat_log.async_add_delta_content_stream(agent_id, deltas()):
            pass
        return heard


def _result(
    user_input: conversation.ConversationInput,
    chat_log: conversation.ChatLog,
    speech: str,
    *,
    keep_open: bool = False,
) -> conversation.ConversationResult:
    response = intent.IntentResponse(language=user_input.language)
    response.async_set_speech(speech)
    return conversation.ConversationResult(
        response=response,
        conversation_id=chat_log.conversation_id,
        continue_conversation=keep_open,
    )


def _apology(
    user_input: conversation.ConversationInput,
    chat_log: conversation.ChatLog,
    apology: str,
    *,
    after: str = "",
) -> conversation.ConversationResult:
    """An error result that speaks `apology` (after what was already said, if anything),
    which the chat log keeps as the assistant's message."""
    chat_log.async_add_assistant_content_without_tools(
        conversation.AssistantContent(agent_id=user_input.agent_id, content=apology)
    )
    response = intent.IntentResponse(language=user_input.language)
    response.async_set_error(intent.IntentResponseErrorCode.UNKNOWN, f"{after} {apology}".strip())
    return conversation.ConversationResult(
        response=response, conversation_id=chat_log.conversation_id
    )
