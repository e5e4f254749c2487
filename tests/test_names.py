"""One name per thing: no public name is defined at the top of two modules of the product.

Where two modules would define the same thing, one defines it and the other imports it;
where they define two things, each has a name that says which (a conversation's `status`
and a turn's are `ConversationStatus` and `TurnStatus`, never two `Status`). A module's
public names are what it defines at its top level (classes, functions, assignments),
never what it imports, nor a name that starts with `_` (`__all__` included).

Exempt, as one convention in every module that binds them:
- `CONVENTIONS`, each module's own instance of the same role;
- a TypeVar or ParamSpec, a type parameter of the module's own signatures;
- a function a module-level FastAPI router or Typer app registers with its decorator: a
  route or a command, reached by its path or its name on the command line, never imported.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The product's packages (bench/ is measurement code, apart from it).
PACKAGES = ("api", "worker", "shared", "compat", "cli", "launcher")

CONVENTIONS = {
    "logger": "a module's `logging.getLogger(__name__)`",
    "router": "a routes module's `APIRouter`",
    "app": "an entry point's application: the API's FastAPI (uvicorn), the command's Typer",
    "main": "the function a `python -m` or console entry point runs",
}

_TYPE_PARAMETERS = {"TypeVar", "ParamSpec", "TypeVarTuple"}
_REGISTRARS = {"APIRouter", "FastAPI", "Typer"}


def _called(node: ast.expr | None) -> str | None:
    """The name a call's function ends with (`typer.Typer(...)`: "Typer")."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """A module's top-level statements, those under a top-level `if` or `try` included."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _statements(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            handled = [line for handler in node.handlers for line in handler.body]
            yield from _statements(node.body + handled + node.orelse + node.finalbody)


def _registered(node: ast.FunctionDef | ast.AsyncFunctionDef, registrars: set[str]) -> bool:
    """Whether a decorator of `node` is a method of one of the module's routers or apps
    (`@router.get(...)`, `@app.command()`)."""
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id in registrars
        ):
            return True
    return False


def public_names(source: str) -> set[str]:
    """The public names a module's source defines at its top level, but for the exempt."""
    statements = list(_statements(ast.parse(source).body))
    registrars = {
        target.id
        for node in statements
        if isinstance(node, ast.Assign) and _called(node.value) in _REGISTRARS
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    defined: set[str] = set()
    deleted: set[str] = set()
    for node in statements:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if not _registered(node, registrars):
                defined.add(node.name)
        elif isinstance(node, ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            if _called(node.value) in _TYPE_PARAMETERS:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Delete):  # a shorthand for the module's own lines
            deleted |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return {
        name for name in defined - deleted if not name.startswith("_") and name not in CONVENTIONS
    }


def definers() -> dict[str, list[str]]:
    """Each public name of the product, with the modules that define it."""
    found: dict[str, list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in public_names(path.read_text()):
                found[name].append(str(path.relative_to(ROOT)))
    return found


def test_each_public_name_is_defined_in_one_module() -> None:
    twice = {name: modules for name, modules in definers().items() if len(modules) > 1}
    listed = "\n".join(f"{name}: {', '.join(twice[name])}" for name in sorted(twice))
    assert not twice, f"{len(twice)} names defined in more than one module:\n{listed}"


def test_a_name_counts_as_defined_however_the_module_binds_it() -> None:
    source = """
import os
from typing import TypeVar
from fastapi import APIRouter
import typer

logger = None
router = APIRouter()
commands = typer.Typer()
T = TypeVar("T")
LIMIT = 3
LIMIT_S: float = 1.0
FIRST, SECOND = 1, 2
_private = 1
if os.name == "nt":
    WINDOWS = True
try:
    import orjson
except ImportError:
    FALLBACK = True
A, B = 1, 2
del A, B

class Status: ...
def helper(): ...
async def fetch(): ...

@router.get("/x")
async def route(): ...

@commands.command()
def command(): ...

@staticmethod
def decorated(): ...
"""
    assert public_names(source) == {
        "commands",
        "LIMIT",
        "LIMIT_S",
        "FIRST",
        "SECOND",
        "WINDOWS",
        "FALLBACK",
        "Status",
        "helper",
        "fetch",
        "decorated",
    }
