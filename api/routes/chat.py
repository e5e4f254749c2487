"""`POST /v1/chat/completions` and the legacy `POST /v1/completions`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Response

from api.auth import Owner
from api.conversations import resolve_conversation
from api.pipeline import check_model, create_turn, respond
from api.schemas import ChatCompletionRequest, CompletionRequest
from api.state import AppState, get_state

router = APIRouter()
State = Annotated[AppState, Depends(get_state)]


@router.post("/chat/completions")
async def chat_completions(
    owner: Owner,
    state: State,
    body: ChatCompletionRequest,
    x_bernard_conversation_id: Annotated[str | None, Header()] = None,
) -> Response:
    """Run one agent turn; stream its events (`stream: true`) or answer one completion."""
    body.check_honourable()
    check_model(body.model)
    conversation_id = await resolve_conversation(
        state.redis, owner, body.conversation_id or x_bernard_conversation_id
    )
    record = await create_turn(state, owner, body.to_turn(), conversation_id)
    return await respond(state, record)


@router.post("/completions")
async def completions(owner: Owner, state: State, body: CompletionRequest) -> Response:
    """Legacy text completion: the response model alone, same pipeline."""
    body.check_honourable()
    check_model(body.model)
    record = await create_turn(state, owner, body.to_turn())
    return await respond(state, record)
