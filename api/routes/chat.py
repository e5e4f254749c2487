"""`POST /v1/chat/completions` and the legacy `POST /v1/completions`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Response

from api.admission import Storing
from api.auth import TurnOwner
from api.client_tools import check_no_clash, check_schemas
from api.conversations import Opened, asked_conversation, check_conversation_id
from api.json_route import OrjsonRoute
from api.negotiation import language
from api.schemas import ChatCompletionRequest, CompletionRequest
from api.state import State
from api.turn_service import check_model, multitask_of, open_turn_conversation, start_turn
from shared.client_tools import tool_names
from shared.confirmation_words import LANGUAGES

router = APIRouter(route_class=OrjsonRoute)


@router.post("/chat/completions")
async def chat_completions(
    owner: TurnOwner,
    state: State,
    body: ChatCompletionRequest,
    x_bernard_conversation_id: Annotated[str | None, Header()] = None,
    accept_language: Annotated[str | None, Header()] = None,
) -> Response:
    """Run one agent turn; stream its events (`stream: true`) or answer one completion.

    A request with no conversation id continues the conversation whose question its resent
    history ends on, its last message answering it (api/conversations.py
    `asked_conversation`); else it starts one."""
    body.check_honourable()
    body.check_limits(state.settings)
    check_model(body.model)
    turn = body.to_turn()
    turn.agent.language = language(accept_language, LANGUAGES)
    await check_no_clash(state.queue, tool_names(turn.agent.client_tools))
    await check_schemas(state.schema_checks, turn.agent.client_tools)
    requested = body.conversation_id or x_bernard_conversation_id
    if requested is not None:
        check_conversation_id(requested)
    else:
        requested = await asked_conversation(state.keeper(owner), turn.agent)
    multitask = multitask_of(state, body.multitask_strategy)

    async def conversation(turn_id: str) -> Opened:
        return await open_turn_conversation(
            state, owner, requested, turn_id, multitask=multitask, answering=turn.agent
        )

    storing = Storing(requested)
    return await start_turn(state, owner, turn, conversation, storing)


@router.post("/completions")
async def completions(owner: TurnOwner, state: State, body: CompletionRequest) -> Response:
    """Legacy text completion: the response model alone, same pipeline."""
    body.check_honourable()
    body.check_limits(state.settings)
    check_model(body.model)
    return await start_turn(state, owner, body.to_turn())
