"""A deterministic engine for unit tests only.

``ScriptedEngine`` never runs a model: generation answers come from a script (a
list, a mapping of prompt keywords, or a function), choice scores come from a
rule, and token log-probabilities come from a hash. Everything is deterministic
so tests of the mechanisms, mutation and controller can assert exact behaviour.

Do not use it to optimise real prompts: its scores mean nothing.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dp_textgrad.engines.base import Engine, EngineError, TokenLogprobs

ResponseScript = Sequence[str] | Mapping[str, str] | Callable[[str, "str | None"], str]
# A rule maps the full context and the choices to unnormalised scores (logits).
ChoiceRule = Mapping[str, str] | Callable[[str, Sequence[str]], Sequence[float]]

# Words plus the whitespace in front of them: a stand-in for a tokenizer.
_TOKEN_PATTERN = re.compile(r"\s*\S+|\s+")


@dataclass(frozen=True)
class ScriptedCall:
    """One ``generate`` call as the engine saw it (for assertions in tests)."""

    prompt: str
    system_prompt: str | None
    temperature: float
    max_tokens: int
    seed: int | None
    stop: tuple[str, ...]


def scripted_tokens(text: str) -> list[str]:
    """Split text the way ``ScriptedEngine`` counts tokens (whitespace-attached words)."""
    return _TOKEN_PATTERN.findall(text)


def _unit_hash(*parts: str) -> float:
    """A deterministic number in [0, 1) from text parts."""
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


class ScriptedEngine(Engine):
    """Deterministic engine for TESTS ONLY (no model behind it).

    ``responses``:
      - a sequence of strings: returned in order (cycling when ``cycle``; otherwise an
        ``EngineError`` once exhausted);
      - a mapping keyword -> response: the first keyword (in mapping order) found in the
        prompt selects the response, else ``default``;
      - a callable ``(prompt, system_prompt) -> str``;
      - ``None``: a deterministic text derived from a hash of the prompt.
    ``choice_rule`` (for ``score_choices_batch``):
      - a mapping keyword -> choice: in the full context (prefix + suffix), the keyword
        that occurs LAST (the record comes after the prompt; case-insensitive) gives its
        choice (compared without surrounding spaces) the logit ``rule_strength``, others 0;
      - a callable ``(context, choices) -> logits``;
      - ``None``: hash-based logits.
    Rows are log-softmaxed over the choices, so each row's probabilities sum to 1 and
    depend only on ``prefix + suffix`` (``score_choices`` on the full context agrees).
    ``generate`` truncates at ``stop`` sequences and at ``max_tokens`` words and
    records every call in ``history``. ``max_context_tokens`` simulates a context
    window: longer inputs raise ``EngineError`` (as a real engine would).
    """

    # Scores are a function of the texts alone: a resumed run may replay an interrupted
    # charge on the same subsample instead of charging it again (dp_textgrad.dp_es.replay).
    deterministic_scores = True

    def __init__(
        self,
        responses: ResponseScript | None = None,
        *,
        default: str | None = None,
        cycle: bool = True,
        choice_rule: ChoiceRule | None = None,
        rule_strength: float = 4.0,
        max_context_tokens: int | None = None,
        model_string: str = "scripted",
    ) -> None:
        super().__init__()
        if isinstance(responses, str):
            raise TypeError("responses: pass a list of strings, a mapping or a callable, not a single string")
        if isinstance(responses, Sequence) and not responses:
            raise ValueError("responses: the list of scripted responses is empty")
        if max_context_tokens is not None and max_context_tokens < 1:
            raise ValueError(f"max_context_tokens: must be >= 1 or None, got {max_context_tokens}")
        if not np.isfinite(rule_strength):
            raise ValueError(f"rule_strength: must be a finite number, got {rule_strength}")
        self.model_string = model_string
        self._responses = responses
        self._default = default
        self._cycle = cycle
        self._choice_rule = choice_rule
        self._rule_strength = float(rule_strength)
        self.max_context_tokens = max_context_tokens
        self._position = 0
        self._lock = threading.Lock()
        self.history: list[ScriptedCall] = []

    # -- generation -----------------------------------------------------------------
    def _generate(
        self,
        prompt: str,
        *,
        system_prompt: str | None,
        temperature: float,
        max_tokens: int,
        seed: int | None,
        stop: list[str] | None,
    ) -> str:
        if max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1, got {max_tokens}")
        prompt_tokens = len(scripted_tokens(system_prompt or "")) + len(scripted_tokens(prompt))
        self._check_context(prompt_tokens)
        with self._timed() as timer:
            with self._lock:
                self.history.append(
                    ScriptedCall(prompt, system_prompt, temperature, max_tokens, seed, tuple(stop or ()))
                )
                text = self._scripted_answer(prompt, system_prompt)
            for marker in stop or ():
                cut = text.find(marker)
                if cut >= 0:
                    text = text[:cut]
            words = scripted_tokens(text)
            if len(words) > max_tokens:
                text = "".join(words[:max_tokens])
        self._count(
            prompt_tokens=prompt_tokens,
            completion_tokens=len(scripted_tokens(text)),
            seconds=timer["seconds"],
        )
        return text

    def _scripted_answer(self, prompt: str, system_prompt: str | None) -> str:
        script = self._responses
        if script is None:
            return f"Scripted answer {hashlib.sha256(prompt.encode('utf-8')).hexdigest()[:8]}."
        if callable(script):
            answer = script(prompt, system_prompt)
            if not isinstance(answer, str):
                raise EngineError("scripted response function returned a non-string")
            return answer
        if isinstance(script, Mapping):
            for keyword, answer in script.items():
                if keyword in prompt:
                    return answer
            if self._default is None:
                raise EngineError("no scripted response matches this prompt and no default is set")
            return self._default
        if self._position >= len(script):
            if not self._cycle:
                raise EngineError(f"scripted responses exhausted after {len(script)} calls")
            self._position = 0
        answer = script[self._position]
        self._position += 1
        return answer

    @property
    def context_tokens(self) -> int | None:
        return self.max_context_tokens

    def count_tokens(self, text: str) -> int:
        return len(scripted_tokens(text))

    def truncate_to_tokens(self, text: str, max_tokens: int) -> str:
        return "".join(scripted_tokens(text)[:max_tokens])

    def _check_context(self, n_tokens: int) -> None:
        if self.max_context_tokens is not None and n_tokens > self.max_context_tokens:
            raise EngineError(f"input has {n_tokens} tokens but the scripted context holds {self.max_context_tokens}")

    # -- scoring --------------------------------------------------------------------
    def score_choices_batch(self, prefix: str, suffixes: Sequence[str], choices: Sequence[str]) -> np.ndarray:
        if not choices:
            raise ValueError("choices: need at least one choice")
        longest = max((len(scripted_tokens(prefix + s)) for s in suffixes), default=0)
        self._check_context(longest + max(len(scripted_tokens(c)) for c in choices))
        with self._timed() as timer:
            rows = [self._choice_logits(prefix + suffix, choices) for suffix in suffixes]
            logits = np.array(rows, dtype=float).reshape(len(suffixes), len(choices))
            scores = _log_softmax(logits) if len(suffixes) else logits
        tokens = len(scripted_tokens(prefix)) + sum(len(scripted_tokens(s)) for s in suffixes)
        self._count(prompt_tokens=tokens, seconds=timer["seconds"])
        return scores

    def _choice_logits(self, context: str, choices: Sequence[str]) -> list[float]:
        rule = self._choice_rule
        if rule is None:
            return [4.0 * _unit_hash("choice", context, choice) for choice in choices]
        if callable(rule):
            logits = [float(v) for v in rule(context, choices)]
            if len(logits) != len(choices) or not all(np.isfinite(logits)):
                raise EngineError("choice_rule must return one finite logit per choice")
            return logits
        lowered = context.lower()
        best_choice, best_position = None, -1
        for keyword, choice in rule.items():
            position = lowered.rfind(keyword.lower())
            if position > best_position:
                best_choice, best_position = choice, position
        # Compare without surrounding spaces: verbalisers are usually " label".
        target = best_choice.strip() if best_choice is not None else None
        return [self._rule_strength if choice.strip() == target else 0.0 for choice in choices]

    def top_next_pieces(self, prefix: str, suffix: str, k: int) -> list[str]:
        """``k`` tokens of the context (and a newline), ranked by a hash of the context: a
        deterministic function of ``prefix + suffix`` alone."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k: must be an integer >= 1, got {k!r}")
        context = prefix + suffix
        pool = sorted({*scripted_tokens(context), "\n"})
        ranked = sorted(pool, key=lambda token: (-_unit_hash("next", context, token), token))
        return ranked[:k]

    def text_pieces(self, text: str) -> list[str]:
        return scripted_tokens(text)

    def token_logprobs(self, text: str, context: str = "") -> TokenLogprobs:
        self._check_context(len(scripted_tokens(context + text)))
        with self._timed() as timer:
            tokens = scripted_tokens(text)
            logprobs, alternatives, means, stds = [], [], [], []
            seen = context
            for token in tokens:
                # log p in (-8, -0.05): deterministic, depends on everything before the token.
                logprob = -0.05 - 7.95 * _unit_hash("token", seen, token)
                alts = [(token, logprob)] + [
                    (f"<alt{k}>", logprob - 0.5 - k * _unit_hash("alt", seen, str(k))) for k in range(1, 5)
                ]
                alts.sort(key=lambda pair: pair[1], reverse=True)
                logprobs.append(logprob)
                alternatives.append(alts)
                means.append(-10.0 - 2.0 * _unit_hash("mean", seen))
                stds.append(1.0 + _unit_hash("std", seen))
                seen += token
        self._count(prompt_tokens=len(scripted_tokens(context)) + len(tokens), seconds=timer["seconds"])
        return TokenLogprobs(
            tokens=tokens,
            logprobs=np.array(logprobs, dtype=float),
            top_alternatives=alternatives,
            vocab_mean=np.array(means, dtype=float),
            vocab_std=np.array(stds, dtype=float),
        )
