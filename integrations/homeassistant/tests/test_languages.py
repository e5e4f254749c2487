"""What the agent says itself, in the configured language (the answers to a confirmation are
Bernard's to read: tests/test_conversation.py shows they are passed through)."""

from __future__ import annotations

import pytest

from custom_components.bernard.languages import LANGUAGES, phrases_for


@pytest.mark.parametrize(
    ("language", "sorry"),
    [
        ("en", "Sorry, I can't reach Bernard right now."),
        ("fr-CA", "Désolé, je n'arrive pas à joindre Bernard."),
        ("de_DE", "Entschuldigung, ich kann Bernard gerade nicht erreichen."),
        ("xx", "Sorry, I can't reach Bernard right now."),
        (None, "Sorry, I can't reach Bernard right now."),
    ],
)
def test_the_phrases_of_a_language_tag_are_its_primary_languages(
    language: str | None, sorry: str
) -> None:
    assert phrases_for(language).sorry == sorry


@pytest.mark.parametrize("language", sorted(LANGUAGES))
def test_every_language_says_every_phrase(language: str) -> None:
    phrases = LANGUAGES[language]
    assert all([phrases.sorry, phrases.failed, phrases.busy, phrases.timer_done_unlabelled])
    assert "{label}" in phrases.timer_done
