"""JSON schemas from outside Bernard (an MCP server's tools, a client's functions), and
arguments checked against them, in a child process with a time bound.

Using a schema someone else wrote may cost without bound: a `pattern` that backtracks (26
characters against `^(a+)+$` held a loop 4 s, each one more doubling it), nested `anyOf`
(2^depth: 48 s at depth 18 with jsonschema-rs), LangChain inlining the `$ref`s of a 1.9 KB
schema (17 MB, 9.3 s); a linear-time regex engine is no bound either (jsonschema-rs's, at its
default limits, took 49 s over 1 MB). So none of it runs on a shared event loop:
`SchemaChecks` hands each check to a child process (`python -m shared.schema_checks`,
started when first needed), one at a time, and waits at most `timeout_s` for the answer.
Past that the check is refused saying so, and the child is killed (the next check starts
another); the child's memory is bounded too (`_MEMORY_BYTES`).

The checks: `schema`, whether it can be used at all (jsonschema-rs compiles it: a valid
schema, each `$ref` resolved within it, never fetched); `tool`, that and LangChain's
conversion of a tool with that schema exactly as a model's `bind_tools` makes it
(`convert_to_openai_tool`), and the bytes of the parameters it gives; `arguments`, the
first error the arguments have against it, and where. Formats are not asserted (as
jsonschema's default); patterns run on jsonschema-rs's default engine (fancy-regex, with
lookarounds and backreferences), within the time bound like everything else. The verdicts
on schemas and tools are kept (`_KEPT` of them), so a schema is checked once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "TIMEOUT_S",
    "Invalid",
    "SchemaChecks",
    "Unusable",
    "Usable",
    "where",
]

logger = logging.getLogger("bernard.schema_checks")

# One check's time at most: a sound schema's takes well under a millisecond.
TIMEOUT_S = 1.0
# How long the child may take to start (it imports LangChain, about 0.6 s).
_START_S = 30.0
# The verdicts on schemas and tools kept, and the compiled schemas the child keeps.
_KEPT = 512
# The child's address space: it uses about 90 MB; a schema that makes more fails its check.
_MEMORY_BYTES = 1024 * 2**20
# The longest message an answer carries (an error quotes the value that failed it).
_MESSAGE_CHARS = 300
_READY = b"ready\n"
# One answer line at most (answers are short, `_MESSAGE_CHARS`).
_LINE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Unusable:
    """A schema that cannot be used, or a check that could not be made, and why."""

    reason: str


@dataclass(frozen=True, slots=True)
class Usable:
    """A tool's schema as a model is offered it: `bytes` of parameters as JSON."""

    bytes: int


@dataclass(frozen=True, slots=True)
class Invalid:
    """Arguments the schema refuses: the first error, at `path` inside them."""

    path: tuple[str | int, ...]
    message: str

    @property
    def where(self) -> str:
        return where(self.path)


def where(path: tuple[str | int, ...] | list[str | int]) -> str:
    """`arguments.entity[0]`: a place inside a call's arguments."""
    return "arguments" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


class SchemaChecks:
    """The checks of one process (see the module docstring); `close` stops its child."""

    def __init__(self, timeout_s: float = TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._child: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._kept: OrderedDict[bytes, Unusable | Usable | None] = OrderedDict()

    async def start(self) -> None:
        """Start the child now rather than at the first check."""
        async with self._lock:
            await self._started()

    async def schema(self, schema: Any) -> Unusable | None:
        """Why `schema` cannot be used; None when it can."""
        verdict = await self._kept_or_asked({"check": "schema", "schema": schema})
        assert not isinstance(verdict, Usable)
        return verdict

    async def tool(self, name: str, description: str, schema: Any) -> Usable | Unusable:
        """A tool with these as a model is offered it, or why it cannot be."""
        request = {"check": "tool", "name": name, "description": description, "schema": schema}
        verdict = await self._kept_or_asked(request)
        assert verdict is not None
        return verdict

    async def arguments(self, schema: Any, arguments: Any) -> Invalid | Unusable | None:
        """What is wrong with `arguments` against `schema`; None when nothing is."""
        answer = await self._ask({"check": "arguments", "schema": schema, "arguments": arguments})
        if "invalid" in answer:
            path = tuple(answer["invalid"]["path"])
            return Invalid(path, answer["invalid"]["message"])
        return _verdict(answer)  # type: ignore[return-value]

    async def close(self) -> None:
        async with self._lock:
            child, self._child = self._child, None
            if child is not None:
                assert child.stdin is not None
                child.stdin.close()
                try:
                    async with asyncio.timeout(5):
                        await child.wait()
                except TimeoutError:
                    _kill(child)
                    await child.wait()

    async def _kept_or_asked(self, request: dict[str, Any]) -> Unusable | Usable | None:
        key = orjson.dumps(request, option=orjson.OPT_SORT_KEYS)
        if key in self._kept:
            self._kept.move_to_end(key)
            return self._kept[key]
        # Kept even when the check could not be made in time: a schema that takes a second
        # takes it again, and a server's listing is checked every 30 s.
        verdict = _verdict(await self._ask(request))
        self._kept[key] = verdict
        if len(self._kept) > _KEPT:
            self._kept.popitem(last=False)
        return verdict

    async def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            line = orjson.dumps(request) + b"\n"
        except TypeError as exc:  # nested deeper than orjson writes (254 levels)
            return {"unusable": f"it cannot be written as JSON: {exc}"}
        async with self._lock:
            child = await self._started()
            assert child.stdin is not None and child.stdout is not None
            try:
                async with asyncio.timeout(self.timeout_s):
                    child.stdin.write(line)
                    await child.stdin.drain()
                    answer = await child.stdout.readline()
            except TimeoutError:
                self._lose(child)
                return {"unusable": f"checking it took over {self.timeout_s:g} s"}
            except (BrokenPipeError, ConnectionResetError):
                answer = b""
            except BaseException:
                # Cancelled, or the pipe broke: the child may still answer this request,
                # which the next would read as its own.
                self._lose(child)
                raise
            if not answer.endswith(b"\n"):
                self._lose(child)
                return {"unusable": "the process checking it ended (it needed too much memory)"}
            result: dict[str, Any] = orjson.loads(answer)
            return result

    async def _started(self) -> asyncio.subprocess.Process:
        if self._child is not None and self._child.returncode is None:
            return self._child
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "shared.schema_checks",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=_LINE_BYTES,
        )
        assert child.stdout is not None
        try:
            async with asyncio.timeout(_START_S):
                ready = await child.stdout.readline()
        except BaseException:
            _kill(child)
            raise
        if ready != _READY:
            _kill(child)
            raise RuntimeError("the schema checking process did not start")
        self._child = child
        return child

    def _lose(self, child: asyncio.subprocess.Process) -> None:
        _kill(child)
        if self._child is child:
            self._child = None


def _kill(child: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.kill()


def _verdict(answer: dict[str, Any]) -> Unusable | Usable | None:
    if "unusable" in answer:
        return Unusable(answer["unusable"])
    if "bytes" in answer:
        return Usable(answer["bytes"])
    return None


# -- the child ------------------------------------------------------------------------------


def _serve() -> None:
    """Answer each request line on stdin with one line on stdout, until stdin closes."""
    resource.setrlimit(resource.RLIMIT_AS, (_MEMORY_BYTES, _MEMORY_BYTES))
    import jsonschema_rs
    from langchain_core.tools import StructuredTool
    from langchain_core.utils.function_calling import convert_to_openai_tool

    compiled: OrderedDict[bytes, Any] = OrderedDict()

    def compile_(schema: Any) -> Any:
        """The schema's validator (raises `ValueError` saying why there is none)."""
        if not isinstance(schema, dict | bool):
            # (jsonschema-rs would read a string as the JSON text of a schema)
            raise ValueError("a schema is a JSON object (or true or false)")
        key = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
        if key in compiled:
            compiled.move_to_end(key)
            return compiled[key]
        try:
            validator = jsonschema_rs.validator_for(schema, offline=True, validate_formats=False)
        except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError) as exc:
            raise ValueError(_said(str(exc).split("\n\n", 1)[0])) from None
        except (TypeError, ValueError) as exc:  # not a JSON object at all
            raise ValueError(_said(str(exc))) from None
        compiled[key] = validator
        if len(compiled) > _KEPT:
            compiled.popitem(last=False)
        return validator

    def answer(request: dict[str, Any]) -> dict[str, Any]:
        check = request["check"]
        try:
            validator = compile_(request["schema"])
        except ValueError as exc:
            return {"unusable": f"not a schema Bernard can check: {exc}"}
        if check == "schema":
            return {}
        if check == "arguments":
            if validator.is_valid(request["arguments"]):  # most are: no errors to gather
                return {}
            for error in validator.iter_errors(request["arguments"]):
                return {
                    "invalid": {"path": list(error.instance_path), "message": _said(error.message)}
                }
            return {}
        bound = StructuredTool(
            name=request["name"],
            description=request["description"],
            args_schema=request["schema"],
            func=_never,
        )
        try:
            offered = convert_to_openai_tool(bound)
        except Exception as exc:
            return {
                "unusable": f"the router cannot offer it: {_said(f'{type(exc).__name__}: {exc}')}"
            }
        return {"bytes": len(orjson.dumps(offered["function"]["parameters"]))}

    out = sys.stdout.buffer
    out.write(_READY)
    out.flush()
    for line in sys.stdin.buffer:
        try:
            said = answer(orjson.loads(line))
        except MemoryError:
            said = {"unusable": "checking it needed too much memory"}
        out.write(orjson.dumps(said) + b"\n")
        out.flush()


def _said(text: str) -> str:
    return text if len(text) <= _MESSAGE_CHARS else f"{text[: _MESSAGE_CHARS - 1]}…"


def _never(**_: Any) -> None:  # pragma: no cover - the child's tools only convert
    raise NotImplementedError


if __name__ == "__main__":
    _serve()
