"""What the agent says itself in each language: the few sentences it speaks when Bernard
cannot answer, and a timer's ring.

A language is one `Phrases` entry of `LANGUAGES`, keyed by its primary subtag ("en" serves
"en-GB"); another language is one more entry. The answers to a confirmation ("yes", "no" and
their common variants) are Bernard's to read (its shared/confirmation_words.py): the agent
passes the user's words through, and Bernard asks its questions in the language the agent
names (`Accept-Language`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Phrases:
    # Spoken when Bernard cannot be reached, and when its turn failed.
    sorry: str
    failed: str
    # Spoken when a turn already runs in this conversation.
    busy: str
    # Announced when a timer rings: `{label}` is the timer's label.
    timer_done: str
    timer_done_unlabelled: str


LANGUAGES: dict[str, Phrases] = {
    "en": Phrases(
        sorry="Sorry, I can't reach Bernard right now.",
        failed="Sorry, I couldn't finish that.",
        busy="I'm still working on your last request.",
        timer_done="Your {label} timer is done.",
        timer_done_unlabelled="Your timer is done.",
    ),
    "fr": Phrases(
        sorry="Désolé, je n'arrive pas à joindre Bernard.",
        failed="Désolé, je n'ai pas pu terminer.",
        busy="Je m'occupe encore de votre dernière demande.",
        timer_done="Votre minuteur {label} est terminé.",
        timer_done_unlabelled="Votre minuteur est terminé.",
    ),
    "de": Phrases(
        sorry="Entschuldigung, ich kann Bernard gerade nicht erreichen.",
        failed="Entschuldigung, das hat nicht geklappt.",
        busy="Ich arbeite noch an deiner letzten Anfrage.",
        timer_done="Dein Timer {label} ist abgelaufen.",
        timer_done_unlabelled="Dein Timer ist abgelaufen.",
    ),
    "es": Phrases(
        sorry="Lo siento, ahora no puedo contactar con Bernard.",
        failed="Lo siento, no he podido terminar.",
        busy="Todavía estoy con tu última petición.",
        timer_done="Tu temporizador {label} ha terminado.",
        timer_done_unlabelled="Tu temporizador ha terminado.",
    ),
    "nl": Phrases(
        sorry="Sorry, ik kan Bernard nu niet bereiken.",
        failed="Sorry, dat is niet gelukt.",
        busy="Ik ben nog bezig met je vorige verzoek.",
        timer_done="Je timer {label} is afgelopen.",
        timer_done_unlabelled="Je timer is afgelopen.",
    ),
    "it": Phrases(
        sorry="Scusa, ora non riesco a raggiungere Bernard.",
        failed="Scusa, non sono riuscito a finire.",
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
