"""docs/variables.md is what `python -m cli.variables` renders from the settings classes, and
every variable product code names is a row of it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings

from cli import variables

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("api", "worker", "shared", "cli", "launcher", "compat", "integrations/homeassistant")
NAME = re.compile(r"\bBERNARD_[A-Z0-9_]*[A-Z0-9]\b")


def named_in_product_code() -> set[str]:
    """Every `BERNARD_*` name in product code: what it reads, and what its messages and
    docstrings tell an operator to set (the Home Assistant integration's code is Python 3.13,
    so the text is read rather than parsed)."""
    found: set[str] = set()
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            if {"tests", ".venv"} & set(path.relative_to(ROOT).parts):
                continue
            found |= set(NAME.findall(path.read_text()))
    return found


def test_the_page_is_what_the_settings_render() -> None:
    assert (ROOT / "docs" / "variables.md").read_text() == variables.variables_page(), (
        "docs/variables.md is out of date: run python -m cli.variables"
    )


def test_every_variable_product_code_names_has_a_row() -> None:
    rows = set(re.findall(r"^\| `([A-Z0-9_]+)`", variables.variables_page(), re.MULTILINE))
    named = named_in_product_code()
    assert {"BERNARD_API_KEYS", "BERNARD_HA_URL", "BERNARD_URL"} <= named
    assert named - rows == set()


def test_rows_name_the_variable_its_default_and_description() -> None:
    page = variables.variables_page()
    assert "| `BERNARD_MAX_BODY_BYTES` | `4194304` | Largest request body (413 beyond) |" in page
    assert "| `REDIS_URL` | `redis://127.0.0.1:6379/0` | Redis holding turns" in page
    assert "| `BERNARD_URL` | `http://127.0.0.1:8000` | The API's base URL" in page


def test_a_field_without_a_description_is_refused() -> None:
    class Half(BaseSettings):
        """Both together."""

        said: str = Field("", alias="BERNARD_SAID", description="Described")
        unsaid: str = Field("", alias="BERNARD_UNSAID")

    with pytest.raises(ValueError, match="unsaid"):
        list(variables._section("Half", Half))


def test_check_fails_on_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = tmp_path / "variables.md"
    monkeypatch.setattr(variables, "PAGE", page)
    page.write_text(variables.variables_page().replace("Largest request body", "Biggest body"))
    assert variables.main(["--check"]) == 1
    assert variables.main([]) == 0
    assert variables.main(["--check"]) == 0
