"""A tiny deterministic fake engine for the evolution tests (no model behind it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from dp_textgrad.engines.base import Engine, TokenLogprobs


class FakeLLM(Engine):
    """Answers from a list (cycled) or a function of the prompt; records every prompt.

    ``fail_with``: an exception instance raised by every ``generate`` call (engine errors).
    Stop sequences are applied like a real engine: the answer is cut at the first one.
    """

    model_string = "fake-llm"

    def __init__(self, responses: Sequence[str] | Callable[[str], str] = ("",), *,
                 fail_with: Exception | None = None) -> None:
        super().__init__()
        self.responses = responses
        self.fail_with = fail_with
        self.prompts: list[str] = []
        self.seeds: list[int | None] = []

    def _generate(self, prompt: str, *, system_prompt: str | None, temperature: float, max_tokens: int,
                  seed: int | None, stop: list[str] | None) -> str:
        self.prompts.append(prompt)
        self.seeds.append(seed)
        if self.fail_with is not None:
            raise self.fail_with
        if callable(self.responses):
            text = self.responses(prompt)
        else:
            text = self.responses[(len(self.prompts) - 1) % len(self.responses)]
        for marker in stop or ():
            at = text.find(marker)
            if at >= 0:
                text = text[:at]
        self._count(prompt_tokens=len(prompt.split()), completion_tokens=len(text.split()))
        return text

    def score_choices_batch(self, prefix: str, suffixes: Sequence[str], choices: Sequence[str]) -> np.ndarray:
        return np.zeros((len(suffixes), len(choices)))

    def token_logprobs(self, text: str, context: str = "") -> TokenLogprobs:
        tokens = text.split()
        return TokenLogprobs(tokens=tokens, logprobs=np.zeros(len(tokens)))
