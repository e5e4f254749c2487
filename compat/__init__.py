"""Where Bernard reaches past a library's documented interface, and only here.

One module per library, each importing only that library (and the standard library); api/,
worker/ and shared/ import them, never the other way round. Each departure has a test in
tests/compat/ that fails when the library renames the name or changes what it does, and the
library an upper bound in pyproject.toml. The departures, and why each is kept:

- `arq`: `WakingWorker` extends arq's `Worker` (its poll iteration, job slots and
  `run_job`): a job starts within milliseconds of its wake-up instead of half of
  `poll_delay` later, and the subclass chooses which due jobs start (worker/queue.py). A job
  taken by a script that also did what `run_job` does first runs by a copy of `run_job`
  without it, and a job's end is one script, not arq's MULTI: 9 commands fewer a job.
- `redis`, `asyncio_streams`: a pooled connection is checked for unread bytes or EOF in
  what it received, not by a zero-timeout read that cost each command a loop iteration
  (p99 of an XADD at 100 streams 14 ms before).
- `redis_cluster`: the Cluster client's ASK redirect (a slot migrating) sends `ASKING` and
  the command on one connection; redis-py sends them on whichever two its node hands out,
  and a write to a moved key failed after 16 redirects (1 turn in 6 whose slot moved). And
  a `TRYAGAIN` (a command of several keys, mid-migration) is waited out for up to 10 s, not
  0.4 s (a turn's ending, landing while its slot moved, failed so).
- `httpx2`, `httpcore2`: the OpenAI client's pools on Bernard's asyncio network backend
  (worker/upstream_sockets.py): 9.3 µs of anyio per read and 11 µs per idle connection per
  request saved.
- `langchain_openai`: the payload `ChatOpenAI` builds and its reading of an answer, for the
  fast path that skips the SDK's transform and per-chunk models (worker/openai_fast.py:
  about 430 µs of worker CPU per token down to 40).
- `langchain_anthropic`: `ChatAnthropic` on the worker's HTTP client (sized to its
  concurrency, closed with it) instead of one cached for the process.
- `sse_starlette`: sends without the per-send cancel scope when no send timeout is set
  (best of 15 rounds of 20,000 sends: 3.05 µs a send with the scope, 0.14 without).
- `mcp_stdio`: the MCP SDK's stdio client reads a server's output through Bernard's reader,
  a line at a time and bounded (worker/tools/mcp/lines.py), instead of copying the line so
  far for each 64 KiB that comes (a 32 MB line: 10 s of the worker's loop, unbounded).
- `requests`: a body read by worker/tools/blocking.py (bounded in size and time) handed to
  the `Response` that requests would otherwise read whole.

Nothing is imported here: importing `compat.langchain_openai` loads LangChain, which the
API process never does.
"""
