"""The libraries' own floors under issue 25's per-token targets: `python -m bench.floors`.

Each floor is the CPU per paced token (50 tokens/s a stream, each token its own frame or
chunk, 100 streams) of one process running the libraries Bernard runs on, with no Bernard
code in the measured path, on loopback. CPU is user + system time from /proc
(bench.processes.cpu_seconds) of the measured process alone, from before its first
request to after its last response, divided by the tokens it handled:

- api: a bare uvicorn app (uvicorn's defaults, uvloop and httptools, as `uvicorn
  api.main:app` runs) streaming a 150-byte chat chunk per token to each of 100 clients
  (bench.client's raw-socket reader, in another process); the app is a raw ASGI `send`,
  Starlette's `StreamingResponse` or sse-starlette's `EventSourceResponse` (pings off, as
  api/sse.py sets it);
- redis: a redis-server of our own; one XADD per token (MAXLEN ~ 10,000, the default
  stream length) to 100 streams, read by 8 XREAD BLOCK lanes of ~12 streams (api/hub.py's
  LANES), both from one client process;
- worker: one process reading 100 streamed chat completions from the scripted upstream
  (bench.upstream) through httpx2 (the OpenAI SDK's HTTP client, worker/llm.py) line by
  line, parsing each chunk's JSON; then also one XADD per chunk through a redis-py asyncio
  pipeline.

Every floor runs `--runs` times; the table gives the median and range.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, MutableMapping
from pathlib import Path
from typing import Any

import orjson

from bench.processes import cpu_seconds
from launcher.redis_server import find_redis_binary, free_port, start_redis

STREAMS = 100
RATE = 50.0  # tokens a second, per stream
TOKENS = 400  # per stream: 8 s paced
LANES = 8
# One chat.completion.chunk frame as the API sends it, about 150 bytes.
FRAME = (
    b'data: {"id":"chatcmpl-0123456789abcdef01234567","object":"chat.completion.chunk",'
    b'"created":1764200000,"model":"bernard-v1","choices":[{"index":0,"delta":'
    b'{"content":" token"},"finish_reason":null}]}\n\n'
)
HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


async def paced(tokens: int) -> AsyncGenerator[bytes, None]:
    """`tokens` frames at RATE, on absolute deadlines so a late wake does not slow the pace."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i in range(tokens):
        delay = start + i / RATE - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        yield FRAME


# -- the API floor's server -------------------------------------------------------------


async def raw_app(scope: Scope, receive: Receive, send: Send) -> None:
    """ASGI: every frame one `send`, nothing between the app and uvicorn."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    async for frame in paced(TOKENS):
        await send({"type": "http.response.body", "body": frame, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def starlette_app(scope: Scope, receive: Receive, send: Send) -> None:
    from starlette.responses import StreamingResponse

    response = StreamingResponse(paced(TOKENS), media_type="text/event-stream")
    await response(scope, receive, send)


async def sse_app(scope: Scope, receive: Receive, send: Send) -> None:
    from sse_starlette import EventSourceResponse

    # Frames already encoded, pings off: how api/sse.py hands the library its chunks.
    response = EventSourceResponse(paced(TOKENS), ping=0, headers={"X-Accel-Buffering": "no"})
    await response(scope, receive, send)


async def frame_app(scope: Scope, receive: Receive, send: Send) -> None:
    from api.sse import FrameResponse

    # For comparison only, Bernard's own: sse-starlette's response without its per-send
    # cancel scope (compat/sse_starlette.py).
    await FrameResponse(paced(TOKENS))(scope, receive, send)


APPS = {"raw": raw_app, "starlette": starlette_app, "sse": sse_app, "frame": frame_app}


def serve(variant: str, port: int) -> None:
    import uvicorn

    uvicorn.run(
        APPS[variant],
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
    )


async def read_streams(port: int) -> None:
    """The API floor's clients: STREAMS raw-socket readers, all at once."""
    from bench.client import request

    calls = await asyncio.gather(
        *(request(("127.0.0.1", port), "GET", "/stream") for _ in range(STREAMS))
    )
    frames = sum(len(c.frames) for c in calls)
    if frames != STREAMS * TOKENS:
        raise SystemExit(f"{frames} frames, expected {STREAMS * TOKENS}")


# -- the Redis floor's client -----------------------------------------------------------


async def redis_load(port: int, batched: bool) -> None:
    from redis.asyncio import Redis

    redis = Redis(port=port, max_connections=STREAMS + LANES)
    names = [f"floor:{i}" for i in range(STREAMS)]
    await redis.delete(*names)
    received = reads = 0
    done, all_read = asyncio.Event(), asyncio.Event()

    async def lane(streams: list[str]) -> None:
        nonlocal received, reads
        # Keyed by the names as XREAD returns them (bytes), so each cursor moves on.
        cursors: dict[Any, Any] = {name.encode(): b"0-0" for name in streams}
        conn = Redis(port=port)
        while not done.is_set():
            got = await conn.xread(cursors, block=200)
            reads += bool(got)
            if received >= STREAMS * TOKENS:
                all_read.set()
            for name, entries in got:
                cursors[name] = entries[-1][0]
                received += len(entries)
        await conn.aclose()

    async def writer(name: str) -> None:
        async for _ in paced(TOKENS):
            await redis.xadd(name, {"e": FRAME[6:-2]}, maxlen=10_000, approximate=True)

    async def ticker() -> None:
        # Every stream's token of a tick in one pipeline: one round trip for 100 XADDs.
        async for _ in paced(TOKENS):
            pipe = redis.pipeline(transaction=False)
            for name in names:
                pipe.xadd(name, {"e": FRAME[6:-2]}, maxlen=10_000, approximate=True)
            await pipe.execute()

    lanes = [asyncio.create_task(lane(names[i::LANES])) for i in range(LANES)]
    await (ticker() if batched else asyncio.gather(*(writer(n) for n in names)))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_read.wait(), 5)
    done.set()
    await asyncio.gather(*lanes)
    await redis.delete(*names)
    await redis.aclose()
    if received != STREAMS * TOKENS:
        raise SystemExit(f"{received} entries read, expected {STREAMS * TOKENS}")
    print(orjson.dumps({"reads": reads}).decode(), flush=True)


# -- the worker floor -------------------------------------------------------------------


async def upstream_load(upstream: int, redis_port: int | None, sockets: bool) -> None:
    """STREAMS streamed completions through httpx2, each chunk's JSON parsed (and XADDed)."""
    import httpx2
    from redis.asyncio import Redis

    limits = httpx2.Limits(max_connections=STREAMS, max_keepalive_connections=STREAMS)
    client = httpx2.AsyncClient(limits=limits, timeout=60)
    if sockets:  # the worker's own network backend under httpx2 (worker/llm.py)
        from worker.upstream_sockets import use_asyncio_sockets

        use_asyncio_sockets(client)
    redis = Redis(port=redis_port, max_connections=STREAMS) if redis_port else None
    message = f"bench t=floor mode=echo n={TOKENS} d={1000 / RATE:g}"
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": message}]}
    url = f"http://127.0.0.1:{upstream}/v1/chat/completions"

    async def one(i: int) -> int:
        chunks = 0
        async with client.stream("POST", url, json=body) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = orjson.loads(line[6:])
                if redis is not None:
                    delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
                    pipe = redis.pipeline(transaction=False)
                    pipe.xadd(f"floor:w{i}", {"e": orjson.dumps(delta)}, maxlen=10_000)
                    await pipe.execute()
                chunks += 1
        return chunks

    counts = await asyncio.gather(*(one(i) for i in range(STREAMS)))
    await client.aclose()
    if redis is not None:
        await redis.delete(*(f"floor:w{i}" for i in range(STREAMS)))
        await redis.aclose()
    if min(counts) < TOKENS:
        raise SystemExit(f"a stream had {min(counts)} chunks, expected at least {TOKENS}")


# -- the runs ---------------------------------------------------------------------------


def _child(*argv: str, stdin: int | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.floors", *argv],
        stdin=stdin,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )


def _wait_port(port: int) -> None:
    import socket

    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def _finish(load: subprocess.Popen[bytes]) -> bytes:
    try:
        out, _ = load.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        load.kill()
        load.wait()
        raise
    if load.returncode:
        raise SystemExit(f"the load failed ({load.returncode})")
    return out


def api_floor(variant: str) -> float:
    """Server CPU µs per frame."""
    port = free_port()
    server = _child("serve", variant, str(port))
    try:
        _wait_port(port)
        before = cpu_seconds(server.pid)
        _finish(_child("clients", str(port)))
        return (cpu_seconds(server.pid) - before) * 1e6 / (STREAMS * TOKENS)
    finally:
        server.terminate()
        server.wait()


def redis_floor(redis_pid: int, redis_port: int, batched: bool) -> tuple[float, float]:
    """Redis CPU µs per token (one XADD, and its share of the lanes' reads), and the
    XREADs that returned entries, per token."""
    before = cpu_seconds(redis_pid)
    out = _finish(_child("redis-load", str(redis_port), str(int(batched))))
    used = cpu_seconds(redis_pid) - before
    reads = int(orjson.loads(out.splitlines()[-1])["reads"])
    return used * 1e6 / (STREAMS * TOKENS), reads / (STREAMS * TOKENS)


def worker_floor(upstream: int, redis_port: int, *, xadd: bool, sockets: bool) -> float:
    """Client CPU µs per chunk; the child measures itself, from its first request on."""
    argv = ["worker-load", str(upstream), str(redis_port if xadd else 0), str(int(sockets))]
    load = _child(*argv)
    out = _finish(load)
    return float(orjson.loads(out.splitlines()[-1])["us_per_chunk"])


def _upstream() -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.upstream"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None
    return proc, int(orjson.loads(proc.stdout.readline())["port"])


def _row(name: str, values: list[float], target: float) -> str:
    med = statistics.median(values)
    return f"| {name} | {med:.1f} | {min(values):.1f}–{max(values):.1f} | ≤ {target:g} |"


def measure(runs: int) -> list[str]:
    results: dict[str, list[float]] = {}
    targets: dict[str, float] = {}
    reads_per_token: dict[str, list[float]] = {}
    redis_rows = {
        False: "Redis: an XADD per token, each its own round trip; 8 XREAD BLOCK lanes",
        True: "Redis: the same XADDs, a tick's 100 in one pipeline; 8 lanes",
    }
    names = {
        "raw": "API: bare uvicorn, raw ASGI `send`",
        "starlette": "API: uvicorn + Starlette `StreamingResponse`",
        "sse": "API: uvicorn + sse-starlette `EventSourceResponse`",
        "frame": "(Bernard's api/sse.py `FrameResponse`, for comparison)",
    }
    workers = {
        (False, False): "worker: httpx2 (anyio backend) stream, JSON per chunk",
        (True, False): "worker: same + XADD per chunk (redis-py pipeline)",
        (False, True): "worker: httpx2 on worker/upstream_sockets.py, JSON per chunk",
        (True, True): "worker: same + XADD per chunk (redis-py pipeline)  ",
    }
    workdir = Path(tempfile.mkdtemp(prefix="floors-"))
    redis_port = free_port()
    redis = start_redis(find_redis_binary(), redis_port, workdir)
    upstream, upstream_port = _upstream()
    try:
        for _ in range(runs):  # interleaved, so the box's load spreads over every floor
            for variant, name in names.items():
                results.setdefault(name, []).append(api_floor(variant))
                targets[name] = 40
            for batched, name in redis_rows.items():
                floor, reads = redis_floor(redis.pid, redis_port, batched)
                results.setdefault(name, []).append(floor)
                reads_per_token.setdefault(name, []).append(reads)
                targets[name] = 10
            for (xadd, sockets), name in workers.items():
                floor = worker_floor(upstream_port, redis_port, xadd=xadd, sockets=sockets)
                results.setdefault(name, []).append(floor)
                targets[name] = 40
            print(f"run done: {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)
    finally:
        upstream.terminate()
        upstream.wait()
        redis.terminate()
        redis.wait()
    head = [
        f"| floor (CPU µs per token, {STREAMS} streams at {RATE:g} tokens/s) "
        f"| median of {runs} | range | target |",
        "|---|---:|---:|---:|",
    ]
    rows = [_row(n, v, targets[n]) for n, v in results.items()]
    notes = [
        f"{name}: XREADs that returned entries, per token, "
        f"{statistics.median(v):.2f} ({min(v):.2f}–{max(v):.2f})"
        for name, v in reads_per_token.items()
    ]
    return [*head, *rows, "", *notes]


def _measured_self(run: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a load in this process and print its own CPU µs per chunk."""
    import httpx2  # noqa: F401  (imported before the clock starts: not a per-token cost)
    import redis.asyncio  # noqa: F401
    import uvloop

    before = cpu_seconds(os.getpid())
    uvloop.run(run())
    used = cpu_seconds(os.getpid()) - before
    print(orjson.dumps({"us_per_chunk": used * 1e6 / (STREAMS * TOKENS)}).decode(), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floors", description=__doc__)
    parser.add_argument("role", nargs="?", default="measure")
    parser.add_argument("args", nargs="*")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    a = args.args
    if args.role == "serve":
        serve(a[0], int(a[1]))
    elif args.role == "clients":
        import uvloop

        uvloop.run(read_streams(int(a[0])))
    elif args.role == "redis-load":
        import uvloop

        uvloop.run(redis_load(int(a[0]), a[1] == "1"))
    elif args.role == "worker-load":
        redis_port = int(a[1]) or None
        _measured_self(lambda: upstream_load(int(a[0]), redis_port, a[2] == "1"))
    else:
        print("\n".join(measure(args.runs)))


if __name__ == "__main__":
    main()
