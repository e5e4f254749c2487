"""The compat package's boundaries: no product module outside it reaches a private name of
another library, compat imports nothing of Bernard's but itself, and the API process loads
none of the compat modules that bring LangChain or arq's worker."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("api", "worker", "shared", "cli", "launcher", "bench")
# What a named tuple offers under an underscore: its documented interface.
NAMEDTUPLE = {"_replace", "_asdict", "_fields", "_make"}


def _modules(*packages: str) -> list[Path]:
    return sorted(path for package in packages for path in (ROOT / package).rglob("*.py"))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def _defined_by_bernard() -> set[str]:
    """Every private name Bernard's own code defines: functions, methods, classes, names it
    assigns (module globals, class attributes), attributes it assigns on `self` or `cls`."""
    names: set[str] = set()
    for path in _modules(*PRODUCT, "compat", "tests"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {name for name in names if _private(name)}


def test_no_module_outside_compat_reaches_a_private_name_of_another_library() -> None:
    own = _defined_by_bernard() | NAMEDTUPLE
    found = []
    for path in _modules(*PRODUCT):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                parts = [*node.module.split("."), *(alias.name for alias in node.names)]
                if node.module.split(".")[0] not in (*PRODUCT, "compat", "tests") and any(
                    _private(part) for part in parts
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} from {node.module}")
    assert found == [], "private names of libraries belong in compat/: " + ", ".join(found)


def test_compat_imports_libraries_and_itself_only() -> None:
    for path in _modules("compat"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = (
                    [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else [alias.name for alias in node.names]
                )
                for name in names:
                    assert name.split(".")[0] not in PRODUCT, f"{path.name} imports {name}"


def test_the_api_process_loads_no_compat_module_of_the_workers_libraries() -> None:
    code = (
        "import sys, api.main; "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('compat.'))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert loaded == [
        "compat.asyncio_streams",
        "compat.redis",
        "compat.redis_cluster",
        "compat.sse_starlette",
    ]
