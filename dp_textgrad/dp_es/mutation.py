"""Mutation and crossover of candidate prompts, from public information only.

The structural barrier: every prompt this module (and ``critique.py``) sends to an
LLM is assembled by :func:`build_llm_prompt`, which accepts only :class:`Scaffold`
(fixed text written into this library) and :class:`PublicText`. ``Private`` values,
private datasets and batches, and plain strings that were never declared public
raise :class:`PrivateDataError`. In ``mode="public"`` PublicText with source
``"unsafe"`` (raw private examples) is refused too; ``mode="unsafe"`` accepts it for
research baselines and audit positive controls, and the run is then NOT DP.

Operators (weights configurable):
  ``llm_rewrite``       few-shot "improved instruction" completion from parent + feedback
  ``llm_crossover``     few-shot merge of two parents' instructions
  ``sentence_crossover`` rule crossover: sentences drawn from both parents
  ``reorder_sentences`` / ``drop_sentence`` / ``insert_phrase`` (public phrase bank)
  ``format_change``     output-format instruction from the phrase bank
  ``verbaliser_hint``   "Answer with exactly one of: a, b, c."
  ``demo_insert`` / ``demo_swap`` / ``demo_remove``  few-shot demos from PUBLIC examples

A candidate prompt is laid out as ``instruction`` followed by demo blocks, separated
by blank lines; demo blocks are recognised by matching the rendered demo pool.
All non-private randomness comes from the seeded ``rng`` given to the engine.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from dp_textgrad.dp_es import phrase_bank
from dp_textgrad.dp_es.population import Candidate, normalise_text
from dp_textgrad.privacy.data import Private, PrivateBatch, PrivateDataError, PrivateDataset, PublicText
from dp_textgrad.tasks.base import Example

if TYPE_CHECKING:
    from dp_textgrad.engines.base import Engine

Mode = Literal["public", "unsafe"]
Feedback = Sequence[PublicText] | Mapping[str, Sequence[PublicText]]

PROMPT_OPEN = "<PROMPT>"
PROMPT_CLOSE = "</PROMPT>"

LLM_OPERATORS = ("llm_rewrite", "llm_crossover")
RULE_OPERATORS = (
    "sentence_crossover", "reorder_sentences", "drop_sentence", "insert_phrase", "format_change",
    "verbaliser_hint", "demo_insert", "demo_swap", "demo_remove", "demo_set",
)
DEFAULT_WEIGHTS: dict[str, float] = {
    "llm_rewrite": 3.0,
    "llm_crossover": 1.5,
    "sentence_crossover": 0.5,
    "reorder_sentences": 0.5,
    "drop_sentence": 0.5,
    "insert_phrase": 1.0,
    "format_change": 0.75,
    "verbaliser_hint": 0.75,
    "demo_insert": 0.75,
    "demo_swap": 0.5,
    "demo_remove": 0.5,
    "demo_set": 2.0,
}
# Operators that call an LLM to write text: off for engines that cannot follow instructions
# (a small base model answers a rewrite request with noise), see MutationEngine.for_engine.
NO_LLM_WEIGHTS: dict[str, float] = {"llm_rewrite": 0.0, "llm_crossover": 0.0}


# -- the barrier ----------------------------------------------------------------------
class Scaffold(str):
    """Fixed text of this library's LLM prompts (instructions, worked examples).

    Only constants written into the code are Scaffold; data never is.
    """

    def __new__(cls, text: str) -> "Scaffold":
        if isinstance(text, (Private, PrivateDataset, PrivateBatch)):
            raise PrivateDataError("private data cannot be used as prompt scaffolding")
        if isinstance(text, PublicText):
            raise TypeError("Scaffold: PublicText keeps its provenance; pass it to the builder as is")
        return super().__new__(cls, text)


def check_public(value: object, *, mode: Mode, field_name: str = "text") -> PublicText:
    """Return ``value`` if it may reach a mutation LLM in ``mode``; raise PrivateDataError otherwise."""
    if isinstance(value, (Private, PrivateDataset, PrivateBatch)):
        raise PrivateDataError(f"{field_name}: private data cannot be put into a mutation prompt")
    if not isinstance(value, PublicText):
        raise PrivateDataError(
            f"{field_name}: {type(value).__name__} is not declared public; "
            "wrap public text as PublicText(text, source=...) (candidates: candidate_text(c))"
        )
    if value.source == "unsafe" and mode != "unsafe":
        raise PrivateDataError(
            f"{field_name}: raw private text (source 'unsafe') is refused in mode='public'; "
            "use mode='unsafe' only for non-private baselines"
        )
    return value


def candidate_text(candidate: Candidate) -> PublicText:
    """A candidate's prompt as PublicText; candidates built from raw private text stay 'unsafe'."""
    return PublicText(candidate.text, "unsafe" if candidate.unsafe else "candidate")


def build_llm_prompt(parts: Sequence[Scaffold | PublicText], *, mode: Mode) -> str:
    """The ONLY way to assemble text for a mutation or critique LLM call."""
    if mode not in ("public", "unsafe"):
        raise ValueError(f"mode: use 'public' or 'unsafe', got {mode!r}")
    pieces: list[str] = []
    for index, part in enumerate(parts):
        if isinstance(part, Scaffold):
            pieces.append(str(part))
        else:
            pieces.append(str(check_public(part, mode=mode, field_name=f"prompt part {index}")))
    return "".join(pieces)


def oneline(text: PublicText, max_chars: int | None = None) -> PublicText:
    """``text`` on one line (few-shot patterns are line-based), provenance kept."""
    flat = re.sub(r"\s+", " ", str(text)).strip()
    if max_chars is not None and len(flat) > max_chars:
        flat = flat[: max_chars - 3].rstrip() + "..."
    return PublicText(flat, text.source)


# -- parsing LLM output ---------------------------------------------------------------
_CONTINUATION_MARKERS = (
    "\nTask:", "\nInstruction:", "\nInstruction A:", "\nInstruction B:", "\nFeedback:",
    "\nImproved instruction:", "\nCombined instruction:", "\nExamples:",
)
_LEADING_LABEL = re.compile(r"^(?:improved|combined|new)?\s*instruction\s*:\s*", re.IGNORECASE)


def extract_prompt(raw: str) -> str:
    """The instruction inside an LLM answer; robust to missing tags and run-on continuations.

    The prompt already opened ``<PROMPT>``, so text before a ``</PROMPT>`` is the answer;
    a model that repeats the tag (chat models) is handled too.
    """
    text = str(raw).replace("\r", "")
    open_at, close_at = text.find(PROMPT_OPEN), text.find(PROMPT_CLOSE)
    if close_at >= 0 and (open_at < 0 or close_at < open_at):
        text = text[:close_at]
    elif open_at >= 0:
        before, after = text[:open_at], text[open_at + len(PROMPT_OPEN):]
        close_at = after.find(PROMPT_CLOSE)
        if close_at >= 0:
            after = after[:close_at]
        text = after if after.strip() else before  # a dangling opening tag ends the answer
    for marker in _CONTINUATION_MARKERS:
        at = text.find(marker)
        if at >= 0:
            text = text[:at]
    text = text.replace(PROMPT_OPEN, " ").replace(PROMPT_CLOSE, " ")
    text = re.sub(r"\s+", " ", text).strip()
    text = _LEADING_LABEL.sub("", text).strip().strip('"').strip()
    return text


def is_degenerate(text: str) -> bool:
    """Looping or junk output of a small model."""
    words = text.split()
    if len(words) >= 8 and len(set(w.casefold() for w in words)) / len(words) < 0.35:
        return True
    if re.search(r"(.)\1{15,}", text):
        return True
    letters = sum(ch.isalpha() for ch in text)
    return letters < 0.5 * len(text)


def word_ngrams(text: str, n: int = 5) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9']+", text.casefold())
    return {tuple(words[i: i + n]) for i in range(len(words) - n + 1)}


def copies_worked_example(text: str, worked: Sequence[str], inputs: Sequence[str], n: int = 5) -> bool:
    """True if ``text`` repeats a run of ``n`` words from a few-shot worked example that
    was not in the real inputs (a small model copying the pattern instead of the task)."""
    borrowed = set().union(*(word_ngrams(w, n) for w in worked)) if worked else set()
    allowed = set().union(*(word_ngrams(i, n) for i in inputs)) if inputs else set()
    return bool((word_ngrams(text, n) & borrowed) - allowed)


_WORKED_INSTRUCTIONS = tuple(ex[3] for ex in phrase_bank.REWRITE_EXAMPLES + phrase_bank.CROSSOVER_EXAMPLES)
_PUBLIC_PHRASES = phrase_bank.INSTRUCTION_PHRASES + phrase_bank.FORMAT_INSTRUCTIONS


# -- prompt layout --------------------------------------------------------------------
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|\s*\n+\s*")


def split_sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_SPLIT.split(text) if s and s.strip()]


def dedupe_sentences(text: str) -> str:
    """``text`` with repeated sentences removed (first occurrence kept)."""
    kept: list[str] = []
    seen: set[str] = set()
    for sentence in split_sentences(text):
        if normalise_text(sentence) not in seen:
            seen.add(normalise_text(sentence))
            kept.append(sentence)
    return " ".join(kept)


def truncate_sentences(text: str, max_chars: int) -> str:
    """Whole sentences of ``text`` that fit in ``max_chars`` (may be empty)."""
    if len(text) <= max_chars:
        return text
    kept: list[str] = []
    for sentence in split_sentences(text):
        if len(" ".join(kept + [sentence])) > max_chars:
            break
        kept.append(sentence)
    return " ".join(kept)


def _norm_block(text: str) -> str:
    return re.sub(r"\n\s*\n+", "\n", str(text)).strip()


@dataclass
class PromptLayout:
    """A candidate prompt split into its instruction and its demo blocks."""

    instruction: str
    demos: list[str] = field(default_factory=list)

    def compose(self) -> str:
        blocks = ([self.instruction.strip()] if self.instruction.strip() else []) + list(self.demos)
        return "\n\n".join(blocks)


def parse_layout(text: str, known_demos: Sequence[str]) -> PromptLayout:
    """Blocks (separated by blank lines) that equal a known demo are demos; the rest is instruction."""
    known = {normalise_text(d) for d in known_demos}
    instruction, demos = [], []
    for block in re.split(r"\n\s*\n", text):
        if not block.strip():
            continue
        (demos if normalise_text(block) in known else instruction).append(block.strip())
    return PromptLayout("\n\n".join(instruction), demos)


def _default_render_demo(example: Example) -> str:
    return f"Text: {example.text}\nLabel: {example.label}"


@dataclass(frozen=True)
class _Op:
    """The outcome of one operator: new text, what was done, whether unsafe text was used."""

    text: str
    operator: str
    meta: dict[str, Any]
    used_unsafe: bool = False


class MutationEngine:
    """Makes children from parents using only public information.

    ``task_description`` must be PublicText; ``labels`` are the public label names;
    ``public_examples`` feed demo operators (rendered with ``render_demo``, e.g.
    ``task.render_demo``). ``unsafe_examples`` (raw private records the caller
    unwrapped on purpose) are accepted only with ``mode="unsafe"``.
    ``engine=None`` disables the LLM operators.
    """

    def __init__(
        self,
        engine: "Engine | None",
        task_description: PublicText,
        labels: Sequence[str],
        public_examples: Sequence[Example],
        rng: np.random.Generator,
        mode: Mode = "public",
        render_demo: Callable[[Example], str] | None = None,
        *,
        unsafe_examples: Sequence[Example] = (),
        weights: Mapping[str, float] | None = None,
        max_prompt_chars: int = 1500,
        min_instruction_chars: int = 12,
        max_demos: int = 4,
        max_feedback_items: int = 3,
        examples_in_prompt: int | None = None,
        temperature: float = 0.8,
        max_tokens: int = 120,
    ) -> None:
        if mode not in ("public", "unsafe"):
            raise ValueError(f"mode: use 'public' or 'unsafe', got {mode!r}")
        self.mode: Mode = mode
        self.task_description = check_public(task_description, mode=mode, field_name="task_description")
        if len(labels) < 2:
            raise ValueError("labels: give the public label names (at least two)")
        self.labels = [check_public(PublicText(str(lab), "user"), mode=mode) for lab in labels]
        if unsafe_examples and mode != "unsafe":
            raise PrivateDataError("unsafe_examples: raw private examples are only allowed with mode='unsafe'")
        self.engine = engine
        self.rng = rng
        self.render_demo = render_demo or _default_render_demo
        self.public_examples = [self._public_example(ex, "public_examples") for ex in public_examples]
        self.unsafe_examples = [self._public_example(ex, "unsafe_examples") for ex in unsafe_examples]
        # The demo pool: rendered text with provenance.
        self.demo_pool: list[PublicText] = [
            PublicText(_norm_block(self.render_demo(ex)), "public_example") for ex in self.public_examples
        ] + [PublicText(_norm_block(self.render_demo(ex)), "unsafe") for ex in self.unsafe_examples]
        self.demo_labels = [ex.label for ex in self.public_examples] + [ex.label for ex in self.unsafe_examples]
        self.phrases = [PublicText(p, "phrase_bank") for p in phrase_bank.INSTRUCTION_PHRASES]
        self.formats = [PublicText(p, "phrase_bank") for p in phrase_bank.FORMAT_INSTRUCTIONS]
        self.weights = self._resolve_weights(weights)
        if max_prompt_chars < 50:
            raise ValueError(f"max_prompt_chars: must be at least 50, got {max_prompt_chars}")
        self.max_prompt_chars = max_prompt_chars
        self.min_instruction_chars = min_instruction_chars
        self.max_demos = max_demos
        self.max_feedback_items = max_feedback_items
        self.examples_in_prompt = (2 if mode == "unsafe" else 0) if examples_in_prompt is None else examples_in_prompt
        self.temperature = temperature
        self.max_tokens = max_tokens

    # -- construction helpers ---------------------------------------------------------
    @staticmethod
    def _public_example(example: object, field_name: str) -> Example:
        if isinstance(example, (Private, PrivateDataset, PrivateBatch)):
            raise PrivateDataError(f"{field_name}: got a Private record; only the controller may unwrap "
                                   "records, and only for unsafe_examples in mode='unsafe'")
        if not isinstance(example, Example):
            raise TypeError(f"{field_name}: expected Example objects, got {type(example).__name__}")
        return example

    @staticmethod
    def _resolve_weights(weights: Mapping[str, float] | None) -> dict[str, float]:
        resolved = dict(DEFAULT_WEIGHTS)
        for name, value in (weights or {}).items():
            if name not in resolved:
                raise ValueError(f"weights: unknown operator {name!r}; known: {sorted(resolved)}")
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"weights[{name!r}]: must be a finite number >= 0, got {value}")
            resolved[name] = float(value)
        if not any(resolved[name] > 0 for name in RULE_OPERATORS):
            raise ValueError("weights: give at least one rule operator a weight > 0 (LLM operators fall back to them)")
        return resolved

    # -- public API -------------------------------------------------------------------
    def variants(self, seed: Candidate, n: int, generation: int = 0) -> list[Candidate]:
        """``n`` distinct variants of the seed prompt (for the initial population)."""
        return self.children([seed], n, generation)

    def children(self, parents: Sequence[Candidate], n: int, generation: int,
                 feedback: Feedback = ()) -> list[Candidate]:
        """Up to ``n`` distinct children (different from their parents and each other).

        ``feedback``: public/DP sentences for all parents, or a mapping parent id ->
        sentences. Parents are used round robin, best first.
        """
        parents = list(parents)
        if not parents:
            raise ValueError("parents: need at least one parent candidate")
        if n < 0:
            raise ValueError(f"n: must be >= 0, got {n}")
        for parent in parents:  # fail fast: an unsafe parent cannot be mutated in public mode
            check_public(candidate_text(parent), mode=self.mode, field_name=f"parent {parent.id}")
        feedback_by_parent = self._feedback_by_parent(parents, feedback)
        seen = {p.key for p in parents}
        out: list[Candidate] = []
        attempts = 0
        while len(out) < n and attempts < 4 * n + 4:
            primary = parents[attempts % len(parents)]
            attempts += 1
            child = self.mutate(primary, parents, generation, feedback_by_parent.get(primary.id, ()))
            if child is None or child.key in seen:
                continue
            seen.add(child.key)
            out.append(child)
        return out

    def mutate(self, primary: Candidate, parents: Sequence[Candidate], generation: int,
               feedback: Sequence[PublicText] = ()) -> Candidate | None:
        """One child of ``primary`` (``parents`` supply crossover partners); None if nothing applies."""
        check_public(candidate_text(primary), mode=self.mode, field_name=f"parent {primary.id}")
        feedback = [check_public(f, mode=self.mode, field_name="feedback") for f in feedback]
        partners = [p for p in parents if p.key != primary.key]
        weights = {name: w for name, w in self.weights.items()
                   if w > 0 and self._applicable(name, primary, partners)}
        while weights:
            names = list(weights)
            probs = np.array([weights[name] for name in names]) / sum(weights.values())
            name = names[int(self.rng.choice(len(names), p=probs))]
            result = self._run(name, primary, partners, feedback)
            if result is not None:
                used = [primary] + ([p for p in partners if p.id in result.meta.get("partner_ids", ())])
                return Candidate.new(
                    result.text,
                    generation=generation,
                    operator=result.operator,
                    parent_ids=[p.id for p in used],
                    operator_meta=result.meta,
                    unsafe=result.used_unsafe or any(p.unsafe for p in used),
                )
            del weights[name]
        return None

    # -- dispatch ---------------------------------------------------------------------
    def _layout(self, candidate: Candidate) -> PromptLayout:
        return parse_layout(candidate.text, self.demo_pool)

    def _applicable(self, name: str, primary: Candidate, partners: Sequence[Candidate]) -> bool:
        layout = self._layout(primary)
        n_sentences = len(split_sentences(layout.instruction))
        if name in LLM_OPERATORS and self.engine is None:
            return False
        if name in ("llm_crossover", "sentence_crossover"):
            return bool(partners)
        if name in ("reorder_sentences", "drop_sentence"):
            return n_sentences >= 2
        if name == "demo_insert":
            return len(layout.demos) < self.max_demos and bool(self._unused_demos(layout))
        if name == "demo_swap":
            return bool(layout.demos) and bool(self._unused_demos(layout))
        if name == "demo_remove":
            return bool(layout.demos)
        if name == "demo_set":
            return len(set(self.demo_labels)) >= 2
        return True

    def _run(self, name: str, primary: Candidate, partners: Sequence[Candidate],
             feedback: Sequence[PublicText]) -> _Op | None:
        if name == "llm_rewrite":
            return self._llm_rewrite(primary, feedback)
        if name == "llm_crossover":
            return self._llm_crossover(primary, partners)
        if name == "sentence_crossover":
            return self._sentence_crossover(primary, partners)
        return self._rule_edit(name, primary)

    def _finish(self, layout: PromptLayout, primary: Candidate, operator: str, meta: dict[str, Any],
                used_unsafe: bool = False) -> _Op | None:
        """Accept an edited layout if it is non-empty, new and within the length limit."""
        text = layout.compose()
        if not layout.instruction.strip() and not layout.demos:
            return None
        if len(text) > self.max_prompt_chars or normalise_text(text) == primary.key:
            return None
        return _Op(text, operator, meta, used_unsafe)

    # -- rule edits -------------------------------------------------------------------
    def _rule_edit(self, name: str, primary: Candidate) -> _Op | None:
        layout = self._layout(primary)
        sentences = split_sentences(layout.instruction)
        demos = list(layout.demos)
        meta: dict[str, Any] = {}
        used_unsafe = False
        if name == "reorder_sentences":
            if len(sentences) < 2:
                return None
            src = int(self.rng.integers(len(sentences)))
            dst = int(self.rng.choice([i for i in range(len(sentences)) if i != src]))
            sentences.insert(dst, sentences.pop(src))
            meta = {"moved_from": src, "moved_to": dst}
        elif name == "drop_sentence":
            if len(sentences) < 2:
                return None
            index = int(self.rng.integers(len(sentences)))
            sentences.pop(index)
            meta = {"dropped_index": index}
        elif name == "insert_phrase":
            present = {normalise_text(s) for s in sentences}
            options = [p for p in self.phrases if normalise_text(p) not in present]
            if not options:
                return None
            phrase = options[int(self.rng.integers(len(options)))]
            position = int(self.rng.integers(len(sentences) + 1))
            sentences.insert(position, str(phrase))
            meta = {"phrase": str(phrase), "position": position}
        elif name == "format_change":
            known = {normalise_text(f) for f in self.formats}
            current = [i for i, s in enumerate(sentences) if normalise_text(s) in known]
            current_keys = {normalise_text(sentences[i]) for i in current}
            options = [f for f in self.formats if normalise_text(f) not in current_keys]
            if not options:
                return None
            fmt = str(options[int(self.rng.integers(len(options)))])
            sentences = [s for i, s in enumerate(sentences) if i not in current] + [fmt]
            meta = {"format": fmt, "replaced": len(current)}
        elif name == "verbaliser_hint":
            order = self.rng.permutation(len(self.labels))
            label_list = ", ".join(str(self.labels[i]) for i in order)
            template = phrase_bank.VERBALISER_HINTS[int(self.rng.integers(len(phrase_bank.VERBALISER_HINTS)))]
            hint = template.format(labels=label_list)
            sentences = [s for s in sentences if not _is_verbaliser_hint(s)] + [hint]
            meta = {"hint": hint}
        elif name == "demo_set":
            return self._demo_set(layout, primary)
        elif name in ("demo_insert", "demo_swap", "demo_remove"):
            unused = self._unused_demos(layout)
            if name == "demo_remove":
                if not demos:
                    return None
                index = int(self.rng.integers(len(demos)))
                demos.pop(index)
                meta = {"removed_index": index}
            else:
                if not unused or (name == "demo_swap" and not demos):
                    return None
                pick = unused[int(self.rng.integers(len(unused)))]
                used_unsafe = pick.source == "unsafe"
                if name == "demo_insert":
                    if len(demos) >= self.max_demos:
                        return None
                    index = int(self.rng.integers(len(demos) + 1))
                    demos.insert(index, str(pick))
                else:
                    index = int(self.rng.integers(len(demos)))
                    demos[index] = str(pick)
                meta = {"demo_pool_index": self.demo_pool.index(pick), "position": index,
                        "demo_source": pick.source}
            return self._finish(PromptLayout(layout.instruction, demos), primary, name, meta, used_unsafe)
        else:
            raise ValueError(f"operator: unknown rule edit {name!r}")
        return self._finish(PromptLayout(" ".join(sentences), demos), primary, name, meta, used_unsafe)

    def _demo_set(self, layout: PromptLayout, primary: Candidate) -> _Op | None:
        """Replace the demonstrations with a balanced set: the same number per label, shuffled.

        A small base model copies the label of a lone demonstration; one to three per label,
        in random order, is what makes few-shot prompting work for it. The largest set that
        fits ``max_prompt_chars`` is kept.
        """
        by_label: dict[str, list[int]] = {}
        for index, label in enumerate(self.demo_labels):
            by_label.setdefault(label, []).append(index)
        per_label = int(self.rng.integers(1, 4))
        for size in range(per_label, 0, -1):
            picks: list[int] = []
            for label in sorted(by_label):
                pool = by_label[label]
                chosen = self.rng.choice(len(pool), size=min(size, len(pool)), replace=False)
                picks += [pool[int(j)] for j in chosen]
            picks = [picks[int(j)] for j in self.rng.permutation(len(picks))]
            edited = PromptLayout(layout.instruction, [str(self.demo_pool[i]) for i in picks])
            if len(edited.compose()) <= self.max_prompt_chars:
                used_unsafe = any(self.demo_pool[i].source == "unsafe" for i in picks)
                return self._finish(edited, primary, "demo_set",
                                    {"per_label": size, "demo_pool_indices": picks}, used_unsafe)
        return None

    def _unused_demos(self, layout: PromptLayout) -> list[PublicText]:
        present = {normalise_text(d) for d in layout.demos}
        return [d for d in self.demo_pool if normalise_text(d) not in present]

    def _sentence_crossover(self, primary: Candidate, partners: Sequence[Candidate]) -> _Op | None:
        partner = partners[int(self.rng.integers(len(partners)))]
        a, b = self._layout(primary), self._layout(partner)
        sa, sb = split_sentences(a.instruction), split_sentences(b.instruction)
        mixed: list[str] = []
        for i in range(max(len(sa), len(sb))):
            options = [s for s in (sa[i] if i < len(sa) else None, sb[i] if i < len(sb) else None) if s]
            take = options[int(self.rng.integers(len(options)))]
            if normalise_text(take) not in {normalise_text(m) for m in mixed}:
                mixed.append(take)
        if normalise_text(" ".join(mixed)) in (normalise_text(a.instruction), normalise_text(b.instruction)):
            # uniform choice reproduced a parent: splice halves instead
            mixed = sa[: (len(sa) + 1) // 2] + [s for s in sb[len(sb) // 2:]
                                                if normalise_text(s) not in {normalise_text(x) for x in sa}]
        demos = _merge_demos(a.demos, b.demos, self.max_demos)
        meta = {"partner_ids": [partner.id]}
        result = self._finish(PromptLayout(" ".join(mixed), demos), primary, "sentence_crossover", meta)
        if result is not None and normalise_text(result.text) == partner.key:
            return None
        return result

    # -- LLM operators ----------------------------------------------------------------
    def _examples_for_prompt(self) -> tuple[list[PublicText], bool]:
        pool = self.unsafe_examples + self.public_examples if self.mode == "unsafe" else self.public_examples
        k = min(self.examples_in_prompt, len(pool))
        if k <= 0:
            return [], False
        picks = sorted(self.rng.choice(len(pool), size=k, replace=False).tolist())
        n_unsafe = len(self.unsafe_examples) if self.mode == "unsafe" else 0
        out = []
        for i in picks:
            source = "unsafe" if i < n_unsafe else "public_example"
            out.append(oneline(PublicText(f"{pool[i].text} -> {pool[i].label}", source), 240))
        return out, any(p.source == "unsafe" for p in out)

    def _ask(self, parts: Sequence[Scaffold | PublicText]) -> tuple[str | None, str | None, int]:
        """Build (through the barrier), call the engine; (raw output, error reason, seed)."""
        prompt = build_llm_prompt(parts, mode=self.mode)
        seed = int(self.rng.integers(2**31 - 1))
        try:
            raw = self.engine.generate(prompt, temperature=self.temperature, max_tokens=self.max_tokens,
                                       seed=seed, stop=[PROMPT_CLOSE, "\n\nTask:"])
        except PrivateDataError:
            raise
        except Exception as exc:  # an engine failure must not end the run: fall back to a rule edit
            return None, f"engine_error:{type(exc).__name__}", seed
        if not isinstance(raw, str):
            return None, "not_text", seed
        return raw, None, seed

    def _accept_instruction(self, raw: str, parent_instruction: str, room: int,
                            inputs: Sequence[str] = ()) -> tuple[str | None, str]:
        text = dedupe_sentences(extract_prompt(raw))  # small models often loop on one sentence
        known = [parent_instruction, *inputs, str(self.task_description), *_PUBLIC_PHRASES]
        if copies_worked_example(text, _WORKED_INSTRUCTIONS, known):
            return None, "copied_example"
        if len(text) > room:
            text = truncate_sentences(text, room)
            if len(text) < self.min_instruction_chars:
                return None, "too_long"
        if len(text) < self.min_instruction_chars:
            return None, "too_short"
        if is_degenerate(text):
            return None, "degenerate"
        if normalise_text(text) == normalise_text(parent_instruction):
            return None, "unchanged"
        return text, "ok"

    def _llm_rewrite(self, primary: Candidate, feedback: Sequence[PublicText]) -> _Op | None:
        layout = self._layout(primary)
        instruction = PublicText(layout.instruction, candidate_text(primary).source)
        chosen = self._pick_feedback(feedback)
        examples, unsafe_examples_used = self._examples_for_prompt()
        parts: list[Scaffold | PublicText] = [
            Scaffold("Each instruction below was rewritten to fix the problems named in the feedback.\n\n")
        ]
        for task, before, fb, after in phrase_bank.REWRITE_EXAMPLES:
            parts.append(Scaffold(f"Task: {task}\nInstruction: {PROMPT_OPEN}{before}{PROMPT_CLOSE}\n"
                                  f"Feedback: {fb}\nImproved instruction: {PROMPT_OPEN}{after}{PROMPT_CLOSE}\n\n"))
        parts += [Scaffold("Task: "), oneline(self.task_description, 400), Scaffold("\n")]
        if examples:
            parts.append(Scaffold("Examples:"))
            for ex in examples:
                parts += [Scaffold(" "), ex, Scaffold(";")]
            parts.append(Scaffold("\n"))
        parts += [Scaffold(f"Instruction: {PROMPT_OPEN}"), oneline(instruction), Scaffold(f"{PROMPT_CLOSE}\n"),
                  Scaffold("Feedback:")]
        if chosen:
            for fb in chosen:
                parts += [Scaffold(" "), oneline(fb, 300)]
        else:
            parts.append(Scaffold(" Make the instruction clearer and more specific."))
        parts.append(Scaffold(f"\nImproved instruction: {PROMPT_OPEN}"))
        raw, error, seed = self._ask(parts)
        meta: dict[str, Any] = {"llm_seed": seed, "feedback_sources": sorted({f.source for f in chosen}),
                                "n_feedback": len(chosen)}
        used_unsafe = unsafe_examples_used or instruction.source == "unsafe"
        if unsafe_examples_used:
            meta["unsafe_examples_in_prompt"] = len(examples)
        if raw is not None:
            room = self.max_prompt_chars - len(PromptLayout("", layout.demos).compose()) - 2
            text, reason = self._accept_instruction(raw, layout.instruction, room, [str(f) for f in chosen])
            if text is not None:
                meta["output_chars"] = len(raw)
                result = self._finish(PromptLayout(text, layout.demos), primary, "llm_rewrite", meta, used_unsafe)
                if result is not None:
                    return result
                reason = "rejected"
            error = reason
        return self._fallback(primary, [], "llm_rewrite", error or "unknown", meta, used_unsafe)

    def _llm_crossover(self, primary: Candidate, partners: Sequence[Candidate]) -> _Op | None:
        partner = partners[int(self.rng.integers(len(partners)))]
        a, b = self._layout(primary), self._layout(partner)
        ia = PublicText(a.instruction, candidate_text(primary).source)
        ib = PublicText(b.instruction, candidate_text(partner).source)
        parts: list[Scaffold | PublicText] = [
            Scaffold("Each pair of instructions below was merged into one that keeps the best parts of both.\n\n")
        ]
        for task, first, second, merged in phrase_bank.CROSSOVER_EXAMPLES:
            parts.append(Scaffold(
                f"Task: {task}\nInstruction A: {PROMPT_OPEN}{first}{PROMPT_CLOSE}\n"
                f"Instruction B: {PROMPT_OPEN}{second}{PROMPT_CLOSE}\n"
                f"Combined instruction: {PROMPT_OPEN}{merged}{PROMPT_CLOSE}\n\n"))
        parts += [Scaffold("Task: "), oneline(self.task_description, 400),
                  Scaffold(f"\nInstruction A: {PROMPT_OPEN}"), oneline(ia), Scaffold(f"{PROMPT_CLOSE}\n"),
                  Scaffold(f"Instruction B: {PROMPT_OPEN}"), oneline(ib), Scaffold(f"{PROMPT_CLOSE}\n"),
                  Scaffold(f"Combined instruction: {PROMPT_OPEN}")]
        raw, error, seed = self._ask(parts)
        meta: dict[str, Any] = {"llm_seed": seed, "partner_ids": [partner.id]}
        used_unsafe = "unsafe" in (ia.source, ib.source)
        if raw is not None:
            demos = _merge_demos(a.demos, b.demos, self.max_demos)
            room = self.max_prompt_chars - len(PromptLayout("", demos).compose()) - 2
            text, reason = self._accept_instruction(raw, a.instruction, room, [b.instruction])
            if text is not None and normalise_text(text) == normalise_text(b.instruction):
                text, reason = None, "unchanged"
            if text is not None:
                meta["output_chars"] = len(raw)
                result = self._finish(PromptLayout(text, demos), primary, "llm_crossover", meta, used_unsafe)
                if result is not None:
                    return result
                reason = "rejected"
            error = reason
        return self._fallback(primary, [partner], "llm_crossover", error or "unknown", meta, used_unsafe)

    def _fallback(self, primary: Candidate, partners: Sequence[Candidate], source_op: str, reason: str,
                  meta: dict[str, Any], used_unsafe: bool) -> _Op | None:
        """A rule edit in place of a failed LLM call, recorded in operator_meta."""
        names = [name for name in RULE_OPERATORS
                 if name != "sentence_crossover" and self.weights[name] > 0 and self._applicable(name, primary, [])]
        order: list[str] = ["sentence_crossover"] if partners else []
        if names:  # the remaining rule edits in a weighted random order
            probs = np.array([self.weights[name] for name in names]) / sum(self.weights[name] for name in names)
            order += [names[i] for i in self.rng.choice(len(names), size=len(names), replace=False, p=probs)]
        for name in order:
            result = (self._sentence_crossover(primary, partners) if name == "sentence_crossover"
                      else self._rule_edit(name, primary))
            if result is None:
                continue
            merged = {**meta, **result.meta, "fallback_from": source_op, "fallback_reason": reason}
            if result.operator != "sentence_crossover" and "partner_ids" in meta:
                merged["attempted_partner_ids"] = merged.pop("partner_ids")  # the child has one parent
            return _Op(result.text, result.operator, merged, used_unsafe or result.used_unsafe)
        return None

    def _pick_feedback(self, feedback: Sequence[PublicText]) -> list[PublicText]:
        if len(feedback) <= self.max_feedback_items:
            return list(feedback)
        picks = sorted(self.rng.choice(len(feedback), size=self.max_feedback_items, replace=False).tolist())
        return [feedback[i] for i in picks]

    def _feedback_by_parent(self, parents: Sequence[Candidate], feedback: Feedback
                            ) -> dict[str, list[PublicText]]:
        if isinstance(feedback, Mapping):
            out = {}
            for pid, items in feedback.items():
                if isinstance(items, (str, Private)):
                    raise TypeError(f"feedback[{pid!r}]: expected a sequence of PublicText, got one text")
                out[pid] = [check_public(f, mode=self.mode, field_name=f"feedback[{pid!r}]") for f in items]
            return out
        if isinstance(feedback, (str, Private)):
            raise TypeError("feedback: expected a sequence of PublicText, got a single text")
        checked = [check_public(f, mode=self.mode, field_name="feedback") for f in feedback]
        return {p.id: checked for p in parents}


_HINT_PREFIXES = tuple(normalise_text(t.split("{labels}")[0]) for t in phrase_bank.VERBALISER_HINTS)


def _is_verbaliser_hint(sentence: str) -> bool:
    return normalise_text(sentence).startswith(_HINT_PREFIXES)


def _merge_demos(first: Sequence[str], second: Sequence[str], limit: int) -> list[str]:
    merged: list[str] = []
    for demo in list(first) + list(second):
        if normalise_text(demo) not in {normalise_text(m) for m in merged}:
            merged.append(demo)
    return merged[:limit]
