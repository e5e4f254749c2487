"""Conversations and what they record, in Redis, by concern:

- shared/records/keeper.py: the record keeper (`RecordKeeper`) and its storage's layout, both
  halves of it on one client: the read-only `Archivist` (reads.py) and the writing
  `Recorder` (writes.py, with its Lua scripts), on what they share (store.py);
- shared/records/decisions.py: what a tool call the user decided on is answered;
- shared/records/conversation.py: a conversation as the keeper gives it back
  (`Conversation`, `Continuation`) and the errors its writes raise;
- shared/records/messages.py: messages in OpenAI's chat shape and the rows a client sees;
- shared/records/history_diff.py: what of a resent history is new (`new_messages`);
- shared/records/call_log.py: the entries of a conversation's LLM and tool call log.

A conversation's status and its moves are shared/conversation_state.py's; its budgets
shared/budgets.py's.
"""
