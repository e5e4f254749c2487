"""The compat package's boundaries: no module outside it (product code, and the Home
Assistant integration in integrations/) reaches a private name of another library, compat
imports nothing of Bernard's but itself, and the API process loads none of the compat
modules that bring LangChain or arq's worker.

A private name reached is one its package defines (Python's convention: a leading underscore
is the module's own, and a package's modules share theirs, as a base class's attributes in one
module are its subclasses' in the next), on `self` as on anything else; any other is another's. This
file also runs as a script (`python test_boundaries.py FILE...`, printing what it finds):
the integration is written for Home Assistant's Python (3.13), newer than this one.
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("api", "worker", "shared", "cli", "launcher", "bench")
INTEGRATION = ROOT / "integrations" / "homeassistant"
# Names under an underscore that their library documents for use: a named tuple's
# interface, and the helpers Home Assistant's developer docs give a config flow subclass
# ("Unique IDs": abort when an entry with the same data exists).
DOCUMENTED = {"_replace", "_asdict", "_fields", "_make", "_async_abort_entries_match"}


def _modules(*packages: str) -> list[Path]:
    return sorted(path for package in packages for path in (ROOT / package).rglob("*.py"))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def _own_names(tree: ast.AST) -> set[str]:
    """The private names a module defines: its functions, methods and classes, the names
    it assigns (globals, class attributes) and the attributes it assigns on `self` or `cls`."""
    names: set[str] = set()
    for node in ast.walk(tree):
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
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if _private(name)}


def _package_names(path: Path) -> set[str]:
    """The private names the modules beside `path` (its package's) define."""
    return _names_in(path.parent)


@functools.cache
def _names_in(package: Path) -> frozenset[str]:
    """Each package is read once, not once per module in it."""
    return frozenset(
        name
        for module in package.glob("*.py")
        for name in _own_names(ast.parse(module.read_text(), str(module)))
    )


def private_names_reached(path: Path, own_packages: tuple[str, ...]) -> list[str]:
    """Where the module at `path` reaches a private name it does not define: an attribute,
    or an import of a private name from a package not in `own_packages` (relative imports
    are the module's own package's)."""
    tree = ast.parse(path.read_text(), str(path))
    own = _package_names(path) | DOCUMENTED
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
            found.append(f"{path}:{node.lineno} .{node.attr}")
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = [*node.module.split("."), *(alias.name for alias in node.names)]
            if node.module.split(".")[0] not in own_packages and any(map(_private, parts)):
                found.append(f"{path}:{node.lineno} from {node.module}")
    return found


def test_no_module_outside_compat_reaches_a_private_name_of_another_library() -> None:
    own_packages = (*PRODUCT, "compat", "tests")
    found = [
        hit for path in _modules(*PRODUCT) for hit in private_names_reached(path, own_packages)
    ]
    assert found == [], "private names of libraries belong in compat/: " + ", ".join(found)


def _integration_python() -> str | None:
    """A Python that reads the integration's syntax (3.12+): Home Assistant's test venv's
    (integrations/homeassistant/tests/setup), or one on PATH."""
    candidates = [str(INTEGRATION / ".venv" / "bin" / "python"), "python3.13", "python3.12"]
    for candidate in candidates:
        try:
            run = subprocess.run(
                [candidate, "-c", "import sys; sys.exit(sys.version_info < (3, 12))"],
                capture_output=True,
            )
        except OSError:
            continue
        if run.returncode == 0:
            return candidate
    return None


def test_the_home_assistant_integration_reaches_no_private_name_of_a_library() -> None:
    python = _integration_python()
    if python is None:
        pytest.skip("the integration's syntax needs Python 3.12+ to read; none was found")
    paths = sorted(str(path) for path in INTEGRATION.rglob("*.py") if ".venv" not in path.parts)
    assert len(paths) > 10, "the integration's modules and tests"
    run = subprocess.run(
        [python, __file__, *paths], cwd=ROOT, capture_output=True, text=True, check=True
    )
    found = json.loads(run.stdout)
    assert found == [], "private names of Home Assistant or another library: " + ", ".join(found)


def test_a_private_name_of_another_module_is_found(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from httpx._client import AsyncClient\n"
        "class A:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "    def f(self, other, client):\n"
        "        return self._mine, other._mine, self._inherited, client._transport\n"
    )
    assert private_names_reached(module, ("shared",)) == [
        f"{module}:1 from httpx._client",
        f"{module}:6 ._inherited",
        f"{module}:6 ._transport",
    ]


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


if __name__ == "__main__":
    # For the integration: own packages are its relative imports alone.
    print(
        json.dumps([hit for name in sys.argv[1:] for hit in private_names_reached(Path(name), ())])
    )
