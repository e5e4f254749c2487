"""The libraries' own floors under the per-token targets: `python -m bench.floors`.

Each floor is the CPU per paced token (each token its own frame or chunk) of one process
running the libraries Bernard runs on, with no Bernard code in the measured path (except
the rows marked as Bernard's), on loopback. CPU is user + system time from /proc
(bench.processes.cpu_seconds) of the measured process alone (with its worker processes,
for a server that has them), from before its first request to after its last response,
divided by the tokens it handled (a reader's from when its clients are built: a worker
builds them once). Two loads: 100 streams at 50 tokens/s (400 tokens a stream) and 1,000
streams at 10 tokens/s (100 a stream); `--scale` shortens both, `--only` picks sections.

- serving: an HTTP server streaming a ~200-byte chat chunk per token to each client
  (bench.client's raw-socket reader, in another process), each stream on its own timer.
  The servers: uvicorn as `./run` starts it (httptools, uvloop), with `--http h11`, with
  `--loop asyncio`, with its access line on; granian's ASGI (its defaults, and its
  single-threaded runtime) and its own RSGI interface (a floor only: FastAPI speaks ASGI).
  The apps: a raw ASGI `send` per frame, Bernard's api/sse.py `FrameResponse` (and, under
  uvicorn at 100 streams, Starlette's `StreamingResponse` and sse-starlette's
  `EventSourceResponse`, pings off, as api/sse.py sets it). Each frame carries the
  monotonic time it was made; the client takes its receipt time once per TCP read, and
  the relay's latency is the difference (the monotonic clock is system-wide on Linux);
- redis: a redis-server of our own; one XADD per token (MAXLEN ~ 10,000, the default
  stream length) to 100 streams, read by 8 XREAD BLOCK lanes of ~12 streams (api/hub.py's
  LANES), both from one client process;
- reading the upstream: one process reading the streamed chat completions of a load from
  the scripted upstream (bench.upstream) line by line, parsing each chunk's JSON with
  orjson, its calls spread over as many connection pools as a worker keeps for that many turns
  (worker/llm.py `pool_shards`): through httpx2 (the OpenAI SDK's HTTP client) on its
  anyio backend and on Bernard's (worker/upstream_sockets.py), then also one XADD per
  chunk through a redis-py asyncio pipeline, and on Bernard's connection each stream
  keeps (shared/redis_pool.py `HeldConnection`, as the worker's rounds go); through the
  SDK's own `post` as worker/openai_fast.py calls it, on httpx2 over Bernard's backend and
  on `DefaultAioHttpClient` (the SDK's aiohttp transport); through aiohttp's client alone
  (its C parser and `StreamReader`).

Every floor runs `--runs` times, interleaved; the tables give the median and range.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.processes import cpu_seconds
from launcher.redis_server import find_redis_binary, free_port, start_redis


@dataclass(frozen=True)
class Load:
    """How many streams, at how many tokens a second each, for how many tokens."""

    streams: int
    rate: float
    tokens: int

    @property
    def name(self) -> str:
        return f"{self.streams:,} × {self.rate:g}/s"

    @property
    def total(self) -> int:
        return self.streams * self.tokens

    def scaled(self, scale: float) -> Load:
        return Load(self.streams, self.rate, max(10, round(self.tokens * scale)))

    def env(self) -> str:
        return f"{self.streams},{self.rate:g},{self.tokens}"

    @classmethod
    def parse(cls, text: str) -> Load:
        streams, rate, tokens = text.split(",")
        return cls(int(streams), float(rate), int(tokens))


# 8 s and 10 s paced.
LOADS = (Load(100, 50.0, 400), Load(1000, 10.0, 100))
# The Redis floor's load.
REDIS_LOAD = LOADS[0]
LANES = 8
# How the servers' children learn the load (granian imports the app in its own worker).
LOAD_ENV = "BENCH_FLOORS_LOAD"
# One chat.completion.chunk frame as the API sends it, about 200 bytes; `created` holds
# the monotonic time the frame was made, to the microsecond.
FRAME_HEAD = (
    b'data: {"id":"chatcmpl-0123456789abcdef01234567","object":"chat.completion.chunk","created":'
)
FRAME_TAIL = (
    b',"model":"bernard-v1","choices":[{"index":0,"delta":{"content":" token"},'
    b'"finish_reason":null}]}\n\n'
)
FRAME = FRAME_HEAD + b"1764200000" + FRAME_TAIL
HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def _load() -> Load:
    return Load.parse(os.environ.get(LOAD_ENV, LOADS[0].env()))


async def paced(load: Load) -> AsyncGenerator[bytes, None]:
    """`load.tokens` frames at `load.rate`, each stamped as it is made, on absolute
    deadlines so a late wake does not slow the pace."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i in range(load.tokens):
        delay = start + i / load.rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        yield FRAME_HEAD + b"%.6f" % time.monotonic() + FRAME_TAIL


def stamp_of(data: bytes) -> float:
    """The monotonic time a frame's `data` was made at (its `created`)."""
    start = len(FRAME_HEAD) - len(b"data: ")
    return float(data[start : data.index(b",", start)])


# -- the serving floors' apps -----------------------------------------------------------


async def raw_app(scope: Scope, receive: Receive, send: Send) -> None:
    """ASGI: every frame one `send`, nothing between the app and the server."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    async for frame in paced(_load()):
        await send({"type": "http.response.body", "body": frame, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def starlette_app(scope: Scope, receive: Receive, send: Send) -> None:
    from starlette.responses import StreamingResponse

    response = StreamingResponse(paced(_load()), media_type="text/event-stream")
    await response(scope, receive, send)


async def sse_app(scope: Scope, receive: Receive, send: Send) -> None:
    from sse_starlette import EventSourceResponse

    # Frames already encoded, pings off: how api/sse.py hands the library its chunks.
    response = EventSourceResponse(paced(_load()), ping=0, headers={"X-Accel-Buffering": "no"})
    await response(scope, receive, send)


async def frame_app(scope: Scope, receive: Receive, send: Send) -> None:
    from api.sse import FrameResponse

    # Bernard's own: sse-starlette's response without its per-send cancel scope
    # (compat/sse_starlette.py).
    await FrameResponse(paced(_load()))(scope, receive, send)


async def rsgi_app(scope: Any, protocol: Any) -> None:
    """granian's RSGI: every frame one `send_bytes` on the response's stream."""
    transport = protocol.response_stream(
        200, [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
    )
    async for frame in paced(_load()):
        await transport.send_bytes(frame)


APPS = {"raw": raw_app, "starlette": starlette_app, "sse": sse_app, "frame": frame_app}


def _uvicorn(app: str, port: int, **options: Any) -> None:
    import uvicorn

    settings: dict[str, Any] = {"log_level": "warning", "access_log": False, **options}
    uvicorn.run(APPS[app], host="127.0.0.1", port=port, lifespan="off", **settings)


def _granian(app: str, port: int, **options: Any) -> None:
    from granian import Granian
    from granian.constants import HTTPModes, Interfaces

    rsgi = app == "rsgi"
    Granian(
        f"bench.floors:{app}_app",
        address="127.0.0.1",
        port=port,
        interface=Interfaces.RSGI if rsgi else Interfaces.ASGINL,
        workers=1,
        http=HTTPModes.http1,
        websockets=False,
        log_enabled=False,
        **options,
    ).serve()


def _granian_st(app: str, port: int) -> None:
    from granian.constants import RuntimeModes

    _granian(app, port, runtime_mode=RuntimeModes.st)


SERVERS: dict[str, tuple[str, Callable[[str, int], None]]] = {
    "uvicorn": ("uvicorn (httptools, uvloop: as `./run`)", _uvicorn),
    "uvicorn-h11": ("uvicorn `--http h11`", lambda a, p: _uvicorn(a, p, http="h11")),
    "uvicorn-asyncio": ("uvicorn `--loop asyncio`", lambda a, p: _uvicorn(a, p, loop="asyncio")),
    "uvicorn-access": (
        "uvicorn, its access line on",
        lambda a, p: _uvicorn(a, p, log_level="info", access_log=True),
    ),
    "granian": ("granian ASGI (its defaults: mt runtime, uvloop)", _granian),
    "granian-st": ("granian ASGI `--runtime-mode st`", _granian_st),
}
APP_NAMES = {
    "raw": "raw ASGI `send`",
    "starlette": "Starlette `StreamingResponse`",
    "sse": "sse-starlette `EventSourceResponse`",
    "frame": "Bernard's `FrameResponse`",
    "rsgi": "RSGI `send_bytes` (a floor only)",
}
# (server, app, at 1,000 streams too): the serving table's rows, in order.
SERVING = [
    ("uvicorn", "raw", True),
    ("uvicorn", "starlette", False),
    ("uvicorn", "sse", False),
    ("uvicorn", "frame", True),
    ("uvicorn-h11", "raw", True),
    ("uvicorn-h11", "frame", True),
    ("uvicorn-asyncio", "raw", True),
    ("uvicorn-asyncio", "frame", True),
    ("uvicorn-access", "raw", True),
    ("granian", "raw", True),
    ("granian", "frame", True),
    ("granian-st", "raw", True),
    ("granian-st", "frame", True),
    ("granian", "rsgi", True),
]


def serve(server: str, app: str, port: int) -> None:
    SERVERS[server][1](app, port)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def read_streams(port: int, load: Load) -> None:
    """The serving floors' clients: `load.streams` raw-socket readers, all at once; prints
    the relay's latency (frame made → received), p50 and p99 in ms."""
    from bench.client import request

    calls = await asyncio.gather(
        *(request(("127.0.0.1", port), "GET", "/stream") for _ in range(load.streams))
    )
    frames = [frame for call in calls for frame in call.frames]
    if len(frames) != load.total:
        raise SystemExit(f"{len(frames)} frames, expected {load.total}")
    latency = [(frame.mono - stamp_of(frame.data)) * 1000 for frame in frames]
    result = {"p50": _quantile(latency, 0.5), "p99": _quantile(latency, 0.99)}
    print(orjson.dumps(result).decode(), flush=True)


# -- the Redis floor's client -----------------------------------------------------------


async def redis_load(port: int, batched: bool, load: Load) -> None:
    from redis.asyncio import Redis

    redis = Redis(port=port, max_connections=load.streams + LANES)
    names = [f"floor:{i}" for i in range(load.streams)]
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
            if received >= load.total:
                all_read.set()
            for name, entries in got:
                cursors[name] = entries[-1][0]
                received += len(entries)
        await conn.aclose()

    async def writer(name: str) -> None:
        async for _ in paced(load):
            await redis.xadd(name, {"e": FRAME[6:-2]}, maxlen=10_000, approximate=True)

    async def ticker() -> None:
        # Every stream's token of a tick in one pipeline: one round trip for 100 XADDs.
        async for _ in paced(load):
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
    if received != load.total:
        raise SystemExit(f"{received} entries read, expected {load.total}")
    print(orjson.dumps({"reads": reads}).decode(), flush=True)


# -- the upstream readers ---------------------------------------------------------------


# The reader's own CPU time when its clients were built: what it spends from then on is
# the measure (a client's TLS context alone, built once a worker, costs about 50 ms).
_CLOCK: list[float] = []


def _start_clock() -> None:
    _CLOCK.append(cpu_seconds(os.getpid()))


def _request(load: Load) -> dict[str, Any]:
    message = f"bench t=floor mode=echo n={load.tokens} d={1000 / load.rate:g}"
    return {"model": "m", "stream": True, "messages": [{"role": "user", "content": message}]}


def _check(counts: list[int], load: Load) -> None:
    if min(counts) < load.tokens:
        raise SystemExit(f"a stream had {min(counts)} chunks, expected at least {load.tokens}")


async def httpx2_load(
    upstream: int, redis_port: int | None, sockets: bool, load: Load, *, held: bool = False
) -> None:
    """`load.streams` streamed completions through httpx2, each chunk's JSON parsed (and
    XADDed: through a redis-py pipeline, or `held` on a connection each stream keeps)."""
    import httpx2
    from redis.asyncio import Redis

    from shared.redis_pool import HeldConnection
    from worker.llm import pool_shards
    from worker.upstream_sockets import use_asyncio_sockets

    # As many pools as a worker keeps for that many turns (worker/llm.py `pool_shards`),
    # each full: httpx2's pool looks over every connection it holds at each request.
    shards = pool_shards(load.streams)
    size = -(-load.streams // shards)
    limits = httpx2.Limits(max_connections=size, max_keepalive_connections=size)
    clients = [httpx2.AsyncClient(limits=limits, timeout=60) for _ in range(shards)]
    if sockets:  # the worker's own network backend under httpx2
        clients = [use_asyncio_sockets(client) for client in clients]
    redis = Redis(port=redis_port, max_connections=load.streams) if redis_port else None
    kept = (
        [HeldConnection(redis.connection_pool) for _ in range(load.streams)]
        if redis and held
        else []
    )
    body = _request(load)
    url = f"http://127.0.0.1:{upstream}/v1/chat/completions"
    _start_clock()

    async def one(i: int) -> int:
        chunks = 0
        async with clients[i % shards].stream("POST", url, json=body) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = orjson.loads(line[6:])
                if redis is not None:
                    delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
                    pipe = kept[i].pipeline() if held else redis.pipeline(transaction=False)
                    pipe.xadd(f"floor:w{i}", {"e": orjson.dumps(delta)}, maxlen=10_000)
                    await pipe.execute()
                chunks += 1
        return chunks

    counts = await asyncio.gather(*(one(i) for i in range(load.streams)))
    for client in clients:
        await client.aclose()
    for connection in kept:
        await connection.aclose()
    if redis is not None:
        await redis.delete(*(f"floor:w{i}" for i in range(load.streams)))
        await redis.aclose()
    _check(counts, load)


async def sdk_load(upstream: int, aiohttp: bool, load: Load) -> None:
    """The same through the openai SDK's `post` with a streamed body, as
    worker/openai_fast.py reads it; on httpx2 over Bernard's backend, or on the SDK's
    aiohttp transport."""
    import httpx2
    from openai import AsyncOpenAI, DefaultAioHttpClient, DefaultAsyncHttpxClient

    from worker.llm import pool_shards
    from worker.upstream_sockets import use_asyncio_sockets

    shards = pool_shards(load.streams)
    size = -(-load.streams // shards)
    limits = httpx2.Limits(max_connections=size, max_keepalive_connections=size)
    https: list[httpx2.AsyncClient] = [
        DefaultAioHttpClient(limits=limits)
        if aiohttp
        else use_asyncio_sockets(DefaultAsyncHttpxClient(limits=limits))
        for _ in range(shards)
    ]
    base_url = f"http://127.0.0.1:{upstream}/v1"
    sdks = [AsyncOpenAI(base_url=base_url, api_key="k", http_client=http) for http in https]
    body = _request(load)
    options: Any = {"headers": {"X-Stainless-Raw-Response": "stream"}}
    _start_clock()

    async def one(i: int) -> int:
        chunks = 0
        response = await sdks[i % shards].post(
            "/chat/completions", cast_to=httpx2.Response, body=body, options=options
        )
        try:
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    continue
                chunk = orjson.loads(data)
                for choice in chunk.get("choices") or ():
                    (choice.get("delta") or {}).get("content")
                chunks += 1
        finally:
            await response.aclose()
        return chunks

    counts = await asyncio.gather(*(one(i) for i in range(load.streams)))
    for sdk in sdks:
        await sdk.close()
    _check(counts, load)


async def aiohttp_load(upstream: int, load: Load) -> None:
    """The same through aiohttp's client alone: its C parser, `StreamReader.readline`."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=load.streams)
    body = _request(load)
    url = f"http://127.0.0.1:{upstream}/v1/chat/completions"
    async with aiohttp.ClientSession(connector=connector) as session:
        _start_clock()

        async def one() -> int:
            chunks = 0
            async with session.post(url, json=body) as response:
                async for line in response.content:
                    if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                        continue
                    orjson.loads(line[6:])
                    chunks += 1
            return chunks

        counts = await asyncio.gather(*(one() for _ in range(load.streams)))
    _check(counts, load)


READERS: dict[str, str] = {
    "anyio": "httpx2 (anyio backend) stream, JSON per chunk",
    "anyio-xadd": "the same + an XADD per chunk (redis-py pipeline)",
    "sockets": "httpx2 on worker/upstream_sockets.py (Bernard's backend), JSON per chunk",
    "sockets-xadd": "the same + an XADD per chunk (redis-py pipeline)",
    "sockets-held": "the same on Bernard's held connection (shared/redis_pool.py), as the worker",
    "sdk": "openai SDK `post` on httpx2 + Bernard's backend, as worker/openai_fast.py",
    "sdk-aiohttp": "openai SDK `post` on `DefaultAioHttpClient` (aiohttp transport)",
    "aiohttp": "aiohttp client alone, `StreamReader` lines, JSON per chunk",
}


def _reader(kind: str, upstream: int, redis_port: int, load: Load) -> Coroutine[Any, Any, None]:
    if kind == "aiohttp":
        return aiohttp_load(upstream, load)
    if kind.startswith("sdk"):
        return sdk_load(upstream, kind == "sdk-aiohttp", load)
    xadd = redis_port if kind.endswith(("-xadd", "-held")) else None
    return httpx2_load(
        upstream, xadd, kind.startswith("sockets"), load, held=kind.endswith("-held")
    )


# -- the runs ---------------------------------------------------------------------------


def _child(*argv: str, load: Load, stderr: int | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.floors", *argv],
        stdout=subprocess.PIPE,
        stderr=stderr,
        env={**os.environ, LOAD_ENV: load.env()},
        start_new_session=True,
    )


def _wait_port(port: int) -> None:
    import socket

    for _ in range(400):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def _finish(load: subprocess.Popen[bytes]) -> bytes:
    try:
        out, _ = load.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        load.kill()
        load.wait()
        raise
    if load.returncode:
        raise SystemExit(f"the load failed ({load.returncode})")
    return out


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (a granian server's worker process)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += parents.get(found[-1], [])
    return found


def _tree_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total


@dataclass
class Serving:
    cpu_us: float  # server CPU µs per frame
    p50_ms: float
    p99_ms: float


def serving_floor(server: str, app: str, load: Load) -> Serving:
    port = free_port()
    quiet = subprocess.DEVNULL if server == "uvicorn-access" else None
    proc = _child("serve", server, app, str(port), load=load, stderr=quiet)
    try:
        _wait_port(port)
        time.sleep(0.5)  # a granian worker's threads settle
        pids = _tree(proc.pid)
        before = _tree_cpu(pids)
        out = _finish(_child("clients", str(port), load=load))
        used = _tree_cpu(pids) - before
        latency = orjson.loads(out.splitlines()[-1])
        return Serving(used * 1e6 / load.total, latency["p50"], latency["p99"])
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def redis_floor(redis_pid: int, redis_port: int, batched: bool, load: Load) -> tuple[float, float]:
    """Redis CPU µs per token (one XADD, and its share of the lanes' reads), and the
    XREADs that returned entries, per token."""
    before = cpu_seconds(redis_pid)
    out = _finish(_child("redis-load", str(redis_port), str(int(batched)), load=load))
    used = cpu_seconds(redis_pid) - before
    reads = int(orjson.loads(out.splitlines()[-1])["reads"])
    return used * 1e6 / load.total, reads / load.total


def reader_floor(kind: str, upstream: int, redis_port: int, load: Load) -> float:
    """Client CPU µs per chunk; the child measures itself, from its first request on (its
    clients built)."""
    out = _finish(_child("read", kind, str(upstream), str(redis_port), load=load))
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


def _spread(values: list[float], digits: int = 1) -> str:
    med = statistics.median(values)
    return f"{med:.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def _load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def measure(runs: int, scale: float, only: set[str]) -> list[str]:
    loads = [load.scaled(scale) for load in LOADS]
    redis_load = REDIS_LOAD.scaled(scale)
    serving: dict[tuple[str, str, Load], list[Serving]] = {}
    redis_results: dict[bool, list[tuple[float, float]]] = {}
    readers: dict[tuple[str, Load], list[float]] = {}
    workdir = Path(tempfile.mkdtemp(prefix="floors-"))
    redis_port = free_port()
    redis = start_redis(find_redis_binary(), redis_port, workdir)
    upstream, upstream_port = _upstream()
    started = _load_average()
    try:
        for _ in range(runs):  # interleaved, so the box's load spreads over every floor
            if "serving" in only:
                for server, app, both in SERVING:
                    for load in loads if both else loads[:1]:
                        result = serving_floor(server, app, load)
                        serving.setdefault((server, app, load), []).append(result)
            if "redis" in only:
                for batched in (False, True):
                    redis_results.setdefault(batched, []).append(
                        redis_floor(redis.pid, redis_port, batched, redis_load)
                    )
            if "reading" in only:
                for kind in READERS:
                    for load in loads:
                        readers.setdefault((kind, load), []).append(
                            reader_floor(kind, upstream_port, redis_port, load)
                        )
            print(
                f"run done: {time.strftime('%H:%M:%S')}, load average {_load_average()}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        upstream.terminate()
        upstream.wait()
        redis.terminate()
        redis.wait()
    lines = [
        f"{runs} runs, tokens a stream {', '.join(str(load.tokens) for load in loads)}; "
        f"load average (1, 5, 15 min) {started} at the start, {_load_average()} at the end",
        "",
    ]
    if serving:
        lines += _serving_table(serving, loads, runs)
    if redis_results:
        lines += _redis_table(redis_results, redis_load, runs)
    if readers:
        cols = " | ".join(load.name for load in loads)
        lines += [
            f"| reading the upstream (CPU µs per chunk; median of {runs}, range) | {cols} |",
            "|---|" + "---:|" * len(loads),
        ]
        for kind, name in READERS.items():
            cells = " | ".join(_spread(readers.get((kind, load), [0.0])) for load in loads)
            lines.append(f"| {name} | {cells} |")
        lines.append("")
    return lines


def _serving_table(
    results: dict[tuple[str, str, Load], list[Serving]], loads: list[Load], runs: int
) -> list[str]:
    cols = [
        f"{label} {load.name}"
        for load in loads
        for label in ("CPU µs / frame", "relay p50 ms", "relay p99 ms")
    ]
    lines = [
        f"| server, app (median of {runs}, range) | {' | '.join(cols)} |",
        "|---|" + "---:|" * len(cols),
    ]
    for server, app, _ in SERVING:
        cells = []
        for load in loads:
            got = results.get((server, app, load))
            if not got:
                cells += ["", "", ""]
                continue
            cells += [
                _spread([r.cpu_us for r in got]),
                _spread([r.p50_ms for r in got], 2),
                _spread([r.p99_ms for r in got], 2),
            ]
        lines.append(f"| {SERVERS[server][0]}, {APP_NAMES[app]} | {' | '.join(cells)} |")
    return [*lines, ""]


def _redis_table(
    results: dict[bool, list[tuple[float, float]]], load: Load, runs: int
) -> list[str]:
    names = {
        False: "an XADD per token, each its own round trip; 8 XREAD BLOCK lanes",
        True: "the same XADDs, a tick's 100 in one pipeline; 8 lanes",
    }
    lines = [
        f"| Redis (CPU µs per token, {load.name}) | median of {runs} | XREADs with entries "
        "per token |",
        "|---|---:|---:|",
    ]
    for batched, got in results.items():
        cpu = _spread([r[0] for r in got])
        lines.append(f"| {names[batched]} | {cpu} | {_spread([r[1] for r in got], 2)} |")
    return [*lines, ""]


def _measured_self(run: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a load in this process and print its own CPU µs per chunk, from when its
    clients were built (`_start_clock`)."""
    # Imported before the clock starts: not a per-token cost.
    import aiohttp  # noqa: F401
    import httpx2  # noqa: F401
    import openai  # noqa: F401
    import redis.asyncio  # noqa: F401
    import uvloop

    import worker.llm  # noqa: F401

    load = _load()
    uvloop.run(run())
    used = cpu_seconds(os.getpid()) - _CLOCK[0]
    print(orjson.dumps({"us_per_chunk": used * 1e6 / load.total}).decode(), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floors", description=__doc__)
    parser.add_argument("role", nargs="?", default="measure")
    parser.add_argument("args", nargs="*")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--scale", type=float, default=1.0, help="tokens a stream, as a share of the full run"
    )
    parser.add_argument(
        "--only",
        default="serving,redis,reading",
        help="which floors, comma-separated: serving, redis, reading",
    )
    args = parser.parse_args(argv)
    a = args.args
    if args.role == "serve":
        serve(a[0], a[1], int(a[2]))
    elif args.role == "clients":
        import uvloop

        uvloop.run(read_streams(int(a[0]), _load()))
    elif args.role == "redis-load":
        import uvloop

        uvloop.run(redis_load(int(a[0]), a[1] == "1", _load()))
    elif args.role == "read":
        _measured_self(lambda: _reader(a[0], int(a[1]), int(a[2]), _load()))
    else:
        only = set(args.only.split(","))
        print("\n".join(measure(args.runs, args.scale, only)))


if __name__ == "__main__":
    main()
