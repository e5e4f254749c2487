"""What the agent understands and says in each language: the answers to a confirmation it
asked ("yes", "no" and their common variants) and the few sentences it speaks itself.

A language is one `Phrases` entry of `LANGUAGES`, keyed by its primary subtag ("en" serves
"en-GB"); another language is one more entry. `understand` reads an utterance as a decision
only when the whole of it (its case, punctuation and spacing aside) is one of the language's
answers: "no, dim it to 30 percent" is not a "no" but a new request, which the caller sends
after rejecting the proposal.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from enum import StrEnum


class Decision(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"
    OTHER = "other"  # not an answer to the question: a new request


@dataclass(frozen=True, slots=True)
class Phrases:
    yes: frozenset[str]
    no: frozenset[str]
    # Spoken when Bernard cannot be reached, and when its turn failed.
    sorry: str
    failed: str
    # Spoken when the confirmation answered was decided elsewhere or has lapsed.
    gone: str
    # Spoken when a turn already runs in this conversation.
    busy: str
    # Announced when a timer rings: `{label}` is the timer's label.
    timer_done: str
    timer_done_unlabelled: str


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
            "yes|yeah|yep|yup|yes please|yes do it|sure|ok|okay|go ahead|do it|please do|"
            "confirm|confirmed|approve|affirmative|that's right|correct"
        ),
        no=_words(
            "no|nope|nah|no thanks|no thank you|don't|do not|don't do it|cancel|stop|"
            "never mind|nevermind|reject|negative|no way"
        ),
        sorry="Sorry, I can't reach Bernard right now.",
        failed="Sorry, I couldn't finish that.",
        gone="That request is no longer waiting; please ask again.",
        busy="I'm still working on your last request.",
        timer_done="Your {label} timer is done.",
        timer_done_unlabelled="Your timer is done.",
    ),
    "fr": Phrases(
        yes=_words(
            "oui|ouais|oui merci|d'accord|ok|okay|vas-y|allez-y|bien sûr|confirme|je confirme|"
            "c'est ça"
        ),
        no=_words("non|non merci|annule|annuler|laisse tomber|pas du tout|surtout pas"),
        sorry="Désolé, je n'arrive pas à joindre Bernard.",
        failed="Désolé, je n'ai pas pu terminer.",
        gone="Cette demande n'attend plus de réponse ; redemandez-moi.",
        busy="Je m'occupe encore de votre dernière demande.",
        timer_done="Votre minuteur {label} est terminé.",
        timer_done_unlabelled="Votre minuteur est terminé.",
    ),
    "de": Phrases(
        yes=_words("ja|jawohl|ja bitte|klar|okay|ok|mach das|mach es|los|bestätigt|genau|richtig"),
        no=_words("nein|nee|nein danke|abbrechen|lass das|lieber nicht|auf keinen fall"),
        sorry="Entschuldigung, ich kann Bernard gerade nicht erreichen.",
        failed="Entschuldigung, das hat nicht geklappt.",
        gone="Diese Anfrage wartet nicht mehr; bitte frag noch einmal.",
        busy="Ich arbeite noch an deiner letzten Anfrage.",
        timer_done="Dein Timer {label} ist abgelaufen.",
        timer_done_unlabelled="Dein Timer ist abgelaufen.",
    ),
    "es": Phrases(
        yes=_words("sí|si|sí por favor|claro|vale|de acuerdo|ok|okay|adelante|hazlo|confirmo"),
        no=_words("no|no gracias|cancela|cancelar|déjalo|para nada"),
        sorry="Lo siento, ahora no puedo contactar con Bernard.",
        failed="Lo siento, no he podido terminar.",
        gone="Esa petición ya no está pendiente; pídemelo de nuevo.",
        busy="Todavía estoy con tu última petición.",
        timer_done="Tu temporizador {label} ha terminado.",
        timer_done_unlabelled="Tu temporizador ha terminado.",
    ),
    "nl": Phrases(
        yes=_words("ja|ja graag|jazeker|prima|oké|ok|okay|doe maar|ga je gang|akkoord"),
        no=_words("nee|nee dank je|nee bedankt|annuleer|laat maar|niet doen"),
        sorry="Sorry, ik kan Bernard nu niet bereiken.",
        failed="Sorry, dat is niet gelukt.",
        gone="Dat verzoek wacht niet meer; vraag het opnieuw.",
        busy="Ik ben nog bezig met je vorige verzoek.",
        timer_done="Je timer {label} is afgelopen.",
        timer_done_unlabelled="Je timer is afgelopen.",
    ),
    "it": Phrases(
        yes=_words("sì|si|sì grazie|certo|va bene|ok|okay|d'accordo|fallo|confermo"),
        no=_words("no|no grazie|annulla|lascia stare|non farlo"),
        sorry="Scusa, ora non riesco a raggiungere Bernard.",
        failed="Scusa, non sono riuscito a finire.",
        gone="Quella richiesta non è più in attesa; chiedimelo di nuovo.",
        busy="Sto ancora lavorando alla tua ultima richiesta.",
        timer_done="Il timer {label} è finito.",
        timer_done_unlabelled="Il timer è finito.",
    ),
}
FALLBACK = "en"


def phrases_for(language: str | None) -> Phrases:
    """The phrases of a language tag ("fr-CA" is French), English for one not in the table."""
    primary = (language or "").replace("_", "-").split("-")[0].lower()
    return LANGUAGES.get(primary, LANGUAGES[FALLBACK])


def understand(text: str, language: str | None) -> Decision:
    """Whether an utterance approves, rejects, or is something else (a new request)."""
    phrases = phrases_for(language)
    said = normalize(text)
    if said in phrases.yes:
        return Decision.APPROVE
    if said in phrases.no:
        return Decision.REJECT
    return Decision.OTHER
