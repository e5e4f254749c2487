"""docs/architecture.md's boundaries, as tests: the import contracts of pyproject.toml
(`lint-imports`: the layers, api and worker apart, the API without LangChain, no import
circle), what the API process loads, and what the worker never reads."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run(
        [str(lint), "--no-logo", "--no-cache", "pyproject.toml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_api_process_loads_no_langchain() -> None:
    code = "import sys, api.main; print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert [name for name in loaded if name.startswith(("langchain", "langgraph"))] == []


def test_the_worker_never_reads_how_a_turn_is_delivered() -> None:
    """The worker runs a turn's `AgentRequest`; its `Delivery` (the encoding, the client's
    options) is the API's alone (shared/requests.py)."""
    found = []
    for path in sorted((ROOT / "worker").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr == "delivery":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} .delivery")
            if isinstance(node, ast.Name) and node.id == "Delivery":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} Delivery")
    assert found == []
