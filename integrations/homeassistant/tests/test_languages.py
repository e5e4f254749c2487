"""Answers to a confirmation asked aloud, read in the configured language."""

from __future__ import annotations

import pytest

from custom_components.bernard.languages import LANGUAGES, Decision, phrases_for, understand

APPROVE, REJECT, OTHER = Decision.APPROVE, Decision.REJECT, Decision.OTHER


@pytest.mark.parametrize(
    ("said", "language", "decision"),
    [
        ("yes", "en", APPROVE),
        ("Yes.", "en", APPROVE),
        ("  YES!  ", "en", APPROVE),
        ("Yes, please", "en-GB", APPROVE),
        ("yeah", "en", APPROVE),
        ("Sure.", "en-US", APPROVE),
        ("OK", "en", APPROVE),
        ("go ahead", "en", APPROVE),
        ("Do it!", "en", APPROVE),
        ("no", "en", REJECT),
        ("No.", "en", REJECT),
        ("nope", "en", REJECT),
        ("No thanks.", "en", REJECT),
        ("Don’t", "en", REJECT),  # the typographic apostrophe speech-to-text writes
        ("don't do it", "en", REJECT),
        ("cancel", "en", REJECT),
        ("never mind", "en", REJECT),
        # Not an answer: a new request, sent after the proposal is rejected.
        ("no, dim it to 30 percent", "en", OTHER),
        ("yes and turn on the hall light", "en", OTHER),
        ("turn on the kitchen light", "en", OTHER),
        ("", "en", OTHER),
        ("yesterday", "en", OTHER),
        ("not now", "en", OTHER),
        # Other languages answer in their own words only.
        ("Oui", "fr", APPROVE),
        ("d'accord", "fr-FR", APPROVE),
        ("D’accord !", "fr", APPROVE),
        ("vas-y", "fr", APPROVE),
        ("Non merci", "fr", REJECT),
        ("non, mets-la à 30 pour cent", "fr", OTHER),
        ("yes", "fr", OTHER),
        ("Ja", "de", APPROVE),
        ("Nein!", "de-AT", REJECT),
        ("Sí", "es", APPROVE),
        ("si", "es", APPROVE),
        ("No, gracias", "es", REJECT),
        ("Ja graag", "nl", APPROVE),
        ("nee", "nl-BE", REJECT),
        ("Sì", "it", APPROVE),
        ("no", "it", REJECT),
        # A language not in the table is read as English.
        ("yes", "pl", APPROVE),
        ("no", "", REJECT),
        ("yes", None, APPROVE),
    ],
)
def test_an_utterance_is_a_decision_only_when_it_is_one_whole_answer(
    said: str, language: str | None, decision: Decision
) -> None:
    assert understand(said, language) is decision


@pytest.mark.parametrize(
    ("language", "sorry"),
    [
        ("en", "Sorry, I can't reach Bernard right now."),
        ("fr-CA", "Désolé, je n'arrive pas à joindre Bernard."),
        ("de_DE", "Entschuldigung, ich kann Bernard gerade nicht erreichen."),
        ("xx", "Sorry, I can't reach Bernard right now."),
    ],
)
def test_the_phrases_of_a_language_tag_are_its_primary_languages(language: str, sorry: str) -> None:
    assert phrases_for(language).sorry == sorry


@pytest.mark.parametrize("language", sorted(LANGUAGES))
def test_no_answer_is_both_yes_and_no(language: str) -> None:
    phrases = LANGUAGES[language]
    assert phrases.yes and phrases.no
    assert not phrases.yes & phrases.no
