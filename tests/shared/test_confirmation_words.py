"""shared/confirmation_words.py: the plain answers to a question, and the question itself."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import pytest

from shared.confirmation_words import LANGUAGES, Verdict, question, understand

APPROVE, REJECT, OTHER = Verdict.APPROVE, Verdict.REJECT, Verdict.OTHER


@pytest.mark.parametrize(
    ("said", "verdict"),
    [
        ("yes", APPROVE),
        ("Yes.", APPROVE),
        ("  YES!  ", APPROVE),
        ("Yes, please", APPROVE),
        ("yeah", APPROVE),
        ("Sure.", APPROVE),
        ("OK", APPROVE),
        ("okay", APPROVE),
        ("go ahead", APPROVE),
        ("Do it!", APPROVE),
        ("Yes, thank you.", APPROVE),
        ("no", REJECT),
        ("No.", REJECT),
        ("nope", REJECT),
        ("No thanks.", REJECT),
        ("Don’t", REJECT),  # the typographic apostrophe speech-to-text writes
        ("don't do it", REJECT),
        ("cancel", REJECT),
        ("never mind", REJECT),
        # Not a plain answer: the model reads it.
        ("no, dim it to 30 percent", OTHER),
        ("yes and turn on the hall light", OTHER),
        ("only the kitchen one", OTHER),
        ("turn on the kitchen light", OTHER),
        ("", OTHER),
        ("   ", OTHER),
        ("yesterday", OTHER),
        ("not now", OTHER),
        ("yes no", OTHER),
        # Every language's answers, whatever the client's language.
        ("Oui", APPROVE),
        ("d'accord", APPROVE),
        ("D’accord !", APPROVE),
        ("vas-y", APPROVE),
        ("Non merci", REJECT),
        ("non, mets-la à 30 pour cent", OTHER),
        ("Ja", APPROVE),
        ("Nein!", REJECT),
        ("Sí", APPROVE),
        ("si", APPROVE),
        ("No, gracias", REJECT),
        ("Ja graag", APPROVE),
        ("nee", REJECT),
        ("Sì", APPROVE),
        ("non farlo", REJECT),
    ],
)
def test_a_message_is_a_plain_answer_only_when_it_is_one_whole_answer(
    said: str, verdict: Verdict
) -> None:
    assert understand(said) is verdict


@pytest.mark.parametrize(
    ("first", "second"), list(itertools.combinations_with_replacement(sorted(LANGUAGES), 2))
)
def test_no_answer_is_yes_in_one_language_and_no_in_another(first: str, second: str) -> None:
    assert not LANGUAGES[first].yes & LANGUAGES[second].no
    assert not LANGUAGES[first].no & LANGUAGES[second].yes


@pytest.mark.parametrize(
    ("summaries", "language", "asked"),
    [
        (["Unlock lock.front_door"], "en", "Shall I unlock lock.front_door?"),
        (["Unlock lock.front_door."], None, "Shall I unlock lock.front_door?"),
        (
            ["Turn on light.kitchen at 40 % brightness"],
            "xx",
            "Shall I turn on light.kitchen at 40 % brightness?",
        ),
        (["HVAC off"], "en", "Shall I HVAC off?"),
        (
            ["Remember “first”", "Remember “second”"],
            "en",
            "Shall I remember “first”? Shall I remember “second”?",
        ),
        (["Unlock lock.front_door"], "fr", "Unlock lock.front_door : je le fais ?"),
        (["Unlock lock.front_door"], "de", "Unlock lock.front_door – soll ich das tun?"),
        (["Unlock lock.front_door"], "es", "Unlock lock.front_door: ¿lo hago?"),
        (["Unlock lock.front_door"], "nl", "Unlock lock.front_door – zal ik dat doen?"),
        (["Unlock lock.front_door"], "it", "Unlock lock.front_door: lo faccio?"),
        ([""], "en", "Shall I go ahead?"),
    ],
)
def test_the_question_is_a_sentence_a_call_in_the_language(
    summaries: list[str], language: str | None, asked: str
) -> None:
    assert question(summaries, language) == asked


def test_bernard_asks_and_reads_every_language_the_home_assistant_agent_speaks() -> None:
    """The integration passes the words through and names its language: each language it
    speaks is one Bernard asks in and reads the answers of."""
    path = Path(__file__).resolve().parents[2] / "integrations/homeassistant/custom_components"
    spec = importlib.util.spec_from_file_location("ha_languages", path / "bernard/languages.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    assert sorted(module.LANGUAGES) == sorted(LANGUAGES) == ["de", "en", "es", "fr", "it", "nl"]
