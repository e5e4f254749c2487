"""Confirmations in words: the question a paused turn asks, and the plain answers to it.

A turn that pauses on tool calls (worker/harness/router.py) says its question as text, one
sentence per call made from the call's summary (`question`), in the user's language where
`LANGUAGES` has it (the request's `Accept-Language`: api/negotiation.py), English otherwise.
The user's next message answers it (api/conversations.py): a whole message that is one of
the plain answers below (its case, punctuation and spacing aside) decides every waiting call
at once, without a model call (`understand`); anything else ("no, dim it to 30 percent") is
read by the model with the waiting calls in front of it.

The answers of every language are read whatever the request's language, since a chat client
rarely says which it speaks; no answer is "yes" in one language and "no" in another
(tests/shared/test_confirmation_words.py holds the table to it). Another language is one
more `Phrases` entry.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["FALLBACK", "LANGUAGES", "Phrases", "Verdict", "normalize", "question", "understand"]


class Verdict(StrEnum):
    """What a message says of the calls waiting for it."""

    APPROVE = "approve"
    REJECT = "reject"
    OTHER = "other"  # not a plain answer: the model reads it


@dataclass(frozen=True, slots=True)
class Phrases:
    yes: frozenset[str]
    no: frozenset[str]
    # One call's question: `{summary}` is its summary as the tool wrote it ("Unlock
    # lock.front_door"), `{action}` the same with a lower-case first letter.
    ask: str


# Typographic apostrophes, as speech-to-text writes them, read as the plain one.
_APOSTROPHES = str.maketrans({"’": "'", "‘": "'", "ʼ": "'"})
# Everything but letters, digits, apostrophes and hyphens inside words is a separator.
_SEPARATORS = re.compile(r"[^\w'-]+|(?<!\w)['-]|['-](?!\w)")


def normalize(text: str) -> str:
    """Lower case, one space between words, no punctuation: "Yes, please!" -> "yes please"."""
    text = unicodedata.normalize("NFC", text).translate(_APOSTROPHES).casefold()
    return " ".join(_SEPARATORS.sub(" ", text).split())


def _words(answers: str) -> frozenset[str]:
    """The answers of a `|`-separated list, normalized."""
    return frozenset(normalize(answer) for answer in answers.split("|"))


LANGUAGES: dict[str, Phrases] = {
    "en": Phrases(
        yes=_words(
            "yes|yeah|yep|yup|yes please|yes do it|yes thanks|yes thank you|sure|ok|okay|"
            "go ahead|do it|please do|confirm|confirmed|approve|approved|affirmative|"
            "that's right|correct|go for it|of course|absolutely"
        ),
        no=_words(
            "no|nope|nah|no thanks|no thank you|don't|do not|don't do it|cancel|stop|"
            "never mind|nevermind|reject|negative|no way|forget it"
        ),
        ask="Shall I {action}?",
    ),
    "fr": Phrases(
        yes=_words(
            "oui|ouais|oui merci|oui vas-y|d'accord|ok|okay|vas-y|allez-y|bien sûr|confirme|"
            "je confirme|c'est ça"
        ),
        no=_words("non|non merci|annule|annuler|laisse tomber|pas du tout|surtout pas"),
        ask="{summary} : je le fais ?",
    ),
    "de": Phrases(
        yes=_words("ja|jawohl|ja bitte|klar|okay|ok|mach das|mach es|los|bestätigt|genau|richtig"),
        no=_words("nein|nee|nein danke|abbrechen|lass das|lieber nicht|auf keinen fall"),
        ask="{summary} – soll ich das tun?",
    ),
    "es": Phrases(
        yes=_words("sí|si|sí por favor|claro|vale|de acuerdo|ok|okay|adelante|hazlo|confirmo"),
        no=_words("no|no gracias|cancela|cancelar|déjalo|para nada"),
        ask="{summary}: ¿lo hago?",
    ),
    "nl": Phrases(
        yes=_words("ja|ja graag|jazeker|prima|oké|ok|okay|doe maar|ga je gang|akkoord"),
        no=_words("nee|nee dank je|nee bedankt|annuleer|laat maar|niet doen"),
        ask="{summary} – zal ik dat doen?",
    ),
    "it": Phrases(
        yes=_words("sì|si|sì grazie|certo|va bene|ok|okay|d'accordo|fallo|confermo"),
        no=_words("no|no grazie|annulla|lascia stare|non farlo"),
        ask="{summary}: lo faccio?",
    ),
}
FALLBACK = "en"
_YES = frozenset().union(*(phrases.yes for phrases in LANGUAGES.values()))
_NO = frozenset().union(*(phrases.no for phrases in LANGUAGES.values()))


def understand(text: str) -> Verdict:
    """Whether a message approves the waiting calls, rejects them, or is something else."""
    said = normalize(text)
    if said in _YES:
        return Verdict.APPROVE
    if said in _NO:
        return Verdict.REJECT
    return Verdict.OTHER


def question(summaries: Sequence[str], language: str | None) -> str:
    """The question asking about calls with these summaries: one sentence each, in
    `language` (a primary subtag of `LANGUAGES`; English for None or another)."""
    ask = LANGUAGES.get(language or FALLBACK, LANGUAGES[FALLBACK]).ask
    sentences = []
    for summary in summaries:
        said = summary.strip().rstrip(".!?").strip() or "go ahead"
        # "Unlock lock.front_door" -> "unlock lock.front_door"; "HVAC ..." stays as it is.
        lower = said[:1].lower() + said[1:] if said[1:2].islower() else said
        sentences.append(ask.format(summary=said, action=lower))
    return " ".join(sentences)
