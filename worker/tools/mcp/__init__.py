"""Any MCP server's tools, joined to the router's.

- config.py: `BERNARD_MCP_CONFIG`, the `mcpServers` file: which servers, over which
  transport, with Bernard's `confirm` and `timeout_s`.
- connection.py: one server's session per worker process, opened in the background,
  reused by every call, opened again with backoff when it is lost.
- bounds.py: what one server may publish (each tool's description and schema, its tools'
  count and bytes in all).
- tool.py: each server tool as a LangChain tool: checked, called with live progress,
  cancelled with the turn, waiting for the user when its annotations say it changes things.
- output.py: what the model reads of a result.
- lines.py: a stdio server's output, a line at a time, each line bounded.
- names.py: `<server>__<tool>`, within OpenAI's rules, never shadowing another tool.
- servers.py: all of a worker's servers and the tools they offer together.

worker/tools/toolbox.py joins them to the built-in tools; this package is imported only
when `BERNARD_MCP_CONFIG` is set (the SDK is slow to import).
"""
