"""Instructions a person could have written for this task: whole sentences, no borrowed domain.

A released prompt once read "Read the message. a positive message. Give the label
without any explanation." on a support-ticket task: a fragment of a sentiment phrase
pasted into another task. Two checks keep rule edits from producing that:

- **whole sentences**: each instruction sentence starts with a capital letter (or a
  digit or quote), ends with ``.``, ``!``, ``?`` or ``:``, and has at least three words;
- **the task's own words**: every content word of a sentence is generic instruction
  vocabulary or appears in the task's public description, label names or public
  examples. A phrase-bank sentence about routing support messages is foreign to a film
  review task, and "positive" is foreign to a support task.

The MutationEngine drops phrase-bank sentences foreign to its task, and rejects any edit that
adds a problem its parent did not have (a user's own seed prompt is never judged).
LLM rewrites get the whole-sentence check only: an instruction-following model may
rightly use words the task description does not.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from dp_textgrad.dp_es.mutation.phrase_bank import FORMAT_INSTRUCTIONS, VERBALISER_HINTS
from dp_textgrad.dp_es.mutation.text_edits import split_sentences

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")
_STARTS_WELL = re.compile(r"^[\"'(\[]?[A-Z0-9]")
_ENDS_WELL = re.compile(r"[.!?:][\"')\]]?$")

# Words any classification instruction may use, whatever its domain.
GENERIC_WORDS = frozenset(
    """
a about above after all also an and answer answers any are as at attention be before being both but by can
careful case category choose class classify consider content decide deciding describe describes detail details
do does each either else every exactly explanation few first fit fits focus for from give given guess have
how if ignore in input into is it its just key kind label labels last least less look lower main many
matches may mean meaning mention mentions more most must name names no not nothing of on one only or other
output over pay person personal possible problem read reply rather seem sentence sentences several should
side single so some specific state stated surface than that the their them then there these they think this
those to tone topic topics two type upper use used usually valid what when where whether which while who
whole why will with without word words would write writer writing written you your
""".split()
)


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _stem(word: str) -> str:
    """Crude plural/verb folding so that 'reviews' matches 'review' and 'asks' matches 'ask'."""
    for suffix in ("ies", "es", "s", "ing", "ed"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


@functools.lru_cache(maxsize=4096)
def _stemmed_words(text: str) -> tuple[tuple[str, str], ...]:
    """Each word of ``text`` with its stem. Memoised: every engine built stems the same phrase
    banks again, and the mechanism audits build thousands (pure function of public text)."""
    return tuple((word, _stem(word)) for word in _words(text))


@functools.lru_cache(maxsize=1)
def _generic_stems() -> frozenset[str]:
    return frozenset(_stem(word) for word in GENERIC_WORDS)


def task_vocabulary(
    description: str, labels: Iterable[str], examples: Iterable[str] = (), formats: Iterable[str] | None = None
) -> frozenset[str]:
    """The (stemmed) words a task's public text uses, plus the generic instruction words and those of
    its family's output-format instructions (``formats``; default: a classification task's, with its
    label hints)."""
    stems = set(_generic_stems())
    labels = list(labels)
    family_words = (
        [*FORMAT_INSTRUCTIONS, *(hint.replace("{labels}", "") for hint in VERBALISER_HINTS)]
        if formats is None
        else list(formats)
    )
    for source in [description, *labels, *examples, *family_words]:
        stems.update(stem for _, stem in _stemmed_words(str(source)))
    return frozenset(stems)


def fragment_problem(sentence: str) -> str | None:
    """Why ``sentence`` is not a whole sentence, or None."""
    text = sentence.strip()
    if not _STARTS_WELL.match(text):
        return f"fragment (no capital letter at the start): {text!r}"
    if not _ENDS_WELL.search(text):
        return f"fragment (no full stop at the end): {text!r}"
    if len(text.split()) < 3:
        return f"fragment (fewer than three words): {text!r}"
    return None


def foreign_words(sentence: str, vocabulary: frozenset[str]) -> list[str]:
    """Content words of ``sentence`` that neither the task's public text nor generic instructions use."""
    return [word for word, stem in _stemmed_words(sentence) if len(word) > 2 and stem not in vocabulary]


def instruction_problems(instruction: str, vocabulary: frozenset[str] | None = None) -> list[str]:
    """Every problem of an instruction's sentences (foreign words only when ``vocabulary`` is given)."""
    problems = []
    for sentence in split_sentences(instruction):
        fragment = fragment_problem(sentence)
        if fragment:
            problems.append(fragment)
        if vocabulary is not None:
            foreign = foreign_words(sentence, vocabulary)
            if foreign:
                problems.append(f"words foreign to the task ({', '.join(sorted(set(foreign)))}): {sentence.strip()!r}")
    return problems


__all__ = ["GENERIC_WORDS", "foreign_words", "fragment_problem", "instruction_problems", "task_vocabulary"]
