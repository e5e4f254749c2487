"""Conversations and what they record, in Redis, by concern:

- shared/records/keeper.py: the record keeper, its storage (`RecordKeeper`, split into a
  read-only `Archivist` and a writing `Recorder`) and its Lua scripts;
- shared/records/conversation.py: a conversation as the keeper gives it back
  (`Conversation`, `Continuation`) and the errors its writes raise;
- shared/records/messages.py: messages in OpenAI's chat shape and the rows a client sees;
- shared/records/history_diff.py: what of a resent history is new (`new_messages`);
- shared/records/call_log.py: the entries of a conversation's LLM and tool call log.

A conversation's status and its moves are shared/conversation_state.py's; its budgets
shared/budgets.py's.
"""
