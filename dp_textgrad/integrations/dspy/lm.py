"""Models both ways between DSPy and dp-textgrad.

:class:`EngineLM` is a dp-textgrad engine (``LlamaCppEngine``, ``OpenAIEngine``, ...) as a
``dspy.LM``: DSPy programs run on it, through DSPy 3.4's custom-engine contract
(``complete(Request) -> Response``). :class:`DSPyLMEngine` is a DSPy LM as a dp-textgrad
engine, for DP-ES's mutation operators and preflight when the user gives only ``lm=``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dp_textgrad.engines.base import Engine, TokenLogprobs, estimated_tokens
from dp_textgrad.integrations.dspy._env import import_dspy
from dp_textgrad.integrations.dspy.batching import PrefixRequest, current_rendezvous

dspy = import_dspy()
lm15 = import_dspy("dspy.lm15")
_LM: Any = dspy.LM

#: What DSPy 3.4's text mode (``model_type="text"``) puts after the messages; a completion
#: engine gets the same, so an adapter lays out one prompt for both.
RESPONSE_MARKER = "BEGIN RESPONSE:"

#: The most tokens a call generates when neither the program nor the LM says.
DEFAULT_MAX_TOKENS = 256


def request_text(request: Any) -> tuple[str | None, str]:
    """A DSPy request as (system text or None, the rest as one text): the messages' contents in
    order, separated by blank lines (a completion model continues the transcript)."""
    system = request.system
    if system is not None and not isinstance(system, str):
        system = "".join(getattr(part, "text", "") or "" for part in system)
    parts = [message.text or "" for message in request.messages]
    return system, "\n\n".join(part for part in parts if part)


class _EngineCompletions:
    """The DSPy custom engine over a dp-textgrad engine: one ``generate`` per request."""

    def __init__(self, engine: Engine, max_tokens: int, instruction_following: bool, reuse_prefix: bool) -> None:
        self.engine = engine
        self.max_tokens = max_tokens
        self.instruction_following = instruction_following
        self.reuse_prefix = reuse_prefix

    def _after_prefix(self, request: Any, system: str | None, config: Any) -> str | None:
        """The continuation through the engine's cached prefix (``generate_after_prefix``), or None
        when it does not apply: the prefix is every message but the last (a candidate's
        instruction and demonstrations, the same for every record), the suffix the last message
        (the call's inputs) and the response marker; the text is the one ``generate`` would get."""
        after = getattr(self.engine, "generate_after_prefix", None)
        if not (self.reuse_prefix and callable(after) and len(request.messages) > 1):
            return None
        if float(config.temperature or 0.0) != 0.0:
            return None
        head = [system] if system else []
        head += [message.text or "" for message in request.messages[:-1]]
        head = [part for part in head if part]
        last = request.messages[-1].text or ""
        if not head or not last:
            return None
        prefix, suffix = "\n\n".join(head) + "\n\n", f"{last}\n\n{RESPONSE_MARKER}"
        max_tokens = int(config.max_tokens or self.max_tokens)
        stop = tuple(config.stop) if config.stop else None
        rendezvous = current_rendezvous()
        if rendezvous is not None:  # one record under several candidates: sent with the others' requests
            return rendezvous.generate(PrefixRequest(self.engine, prefix, suffix, max_tokens, stop))
        (output,) = after(prefix, [suffix], max_tokens=max_tokens, stop=list(stop) if stop else None)
        return str(output)

    def complete(self, request: Any) -> Any:
        """One DSPy request as one ``engine.generate`` call (the class docstring of EngineLM)."""
        system, text = request_text(request)
        if self.instruction_following and system:
            prompt, system_prompt = text, system
        else:  # a completion model gets the transcript as one text, as DSPy's text mode sends it
            prompt, system_prompt = "\n\n".join(p for p in (system, text, RESPONSE_MARKER) if p), None
        config = request.config
        output = None if system_prompt is not None else self._after_prefix(request, system, config)
        if output is None:
            output = self.engine.generate(
                prompt,
                system_prompt,
                temperature=float(config.temperature or 0.0),
                max_tokens=int(config.max_tokens or self.max_tokens),
                seed=config.seed,
                stop=list(config.stop) if config.stop else None,
            )
        prompt_tokens = estimated_tokens(prompt + (system_prompt or ""))
        output_tokens = estimated_tokens(output)
        return lm15.Response(
            id=None,
            model=str(getattr(self.engine, "model_string", "engine")),
            message=lm15.Message.assistant([lm15.TextPart(output)]),
            finish_reason="stop",
            usage=lm15.Usage(
                input_tokens=prompt_tokens, output_tokens=output_tokens, total_tokens=prompt_tokens + output_tokens
            ),
        )

    def stream(self, request: Any) -> Any:
        return lm15.response_to_events(self.complete(request))

    def close(self) -> None:
        """The engine belongs to the caller, who closes it."""


class EngineLM(_LM):
    """A dp-textgrad engine as a ``dspy.LM``: ``dspy.configure(lm=EngineLM(LlamaCppEngine()))``.

    Each DSPy call is one ``engine.generate``: the system message goes to the engine's system
    prompt when the engine follows instructions; for a completion (base) model the messages are
    joined into one text it continues, as DSPy's text mode does (contents separated by blank
    lines, then ``BEGIN RESPONSE:``; pair it with :class:`CompletionAdapter`). DSPy's response
    cache is off by default (``cache=False``) and retries are the engine's own
    (``num_retries=0``). Token counts in DSPy's usage are estimates (4 bytes per token).
    ``max_tokens``: the length of a generation when the program gives none (default: the
    engine's ``default_max_tokens`` if it has one, else 256). ``instruction_following``: send chat
    (system prompt apart) or one completion text; default: the engine's own attribute.
    ``reuse_prefix``: for a completion text of several messages (:class:`CompletionAdapter` sends
    the instruction and demonstrations as one message and the call's inputs as the last) and
    greedy decoding, generate after the engine's cached prefix (``generate_after_prefix``: the
    prefix is decoded once and kept while records follow), the same text as one ``generate``.
    Such calls made while DPES scores one private record under several candidates meet there
    and go to the engine together (:mod:`.batching`: ``generate_for_prefixes`` on llama.cpp).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_tokens: int | None = None,
        instruction_following: bool | None = None,
        cache: bool = False,
        reuse_prefix: bool = True,
        **kwargs: Any,
    ) -> None:
        if not callable(getattr(engine, "generate", None)):
            raise TypeError(f"engine: expected a dp-textgrad engine, got {type(engine).__name__}")
        self.dp_engine = engine
        name = str(getattr(engine, "model_string", type(engine).__name__)) or "engine"
        if max_tokens is None:
            max_tokens = int(getattr(engine, "default_max_tokens", DEFAULT_MAX_TOKENS))
        kwargs.setdefault("num_retries", 0)
        following = (
            getattr(engine, "instruction_following", True) if instruction_following is None else instruction_following
        )
        super().__init__(
            model=f"dp-textgrad/{name}",
            model_type="text",
            max_tokens=max_tokens,
            cache=cache,
            engine=_EngineCompletions(engine, max_tokens, bool(following), bool(reuse_prefix)),
            **kwargs,
        )


def batches_candidates(lm: Any) -> bool:
    """Whether scoring one record under several candidates at once pays on ``lm``: an
    :class:`EngineLM` that generates after cached prefixes, on an engine that decodes several
    prefixes together (``batches_prefixes``)."""
    completions = getattr(lm, "engine", None) if isinstance(lm, EngineLM) else None
    return bool(
        isinstance(completions, _EngineCompletions)
        and completions.reuse_prefix
        and getattr(completions.engine, "batches_prefixes", False)
    )


def _first_text(outputs: Any) -> str:
    if isinstance(outputs, str):
        return outputs
    if isinstance(outputs, (list, tuple)) and outputs:
        first = outputs[0]
        if isinstance(first, dict):
            return str(first.get("text") or "")
        return "" if first is None else str(first)
    return ""


class DSPyLMEngine(Engine):
    """A DSPy LM as a dp-textgrad engine: DP-ES's mutation operators and preflight generate
    through it (public text only; DPES scores private records with the program itself).

    ``instruction_following``: whether the model follows instructions, so that LLM rewrites and
    critiques are worth asking for; False by default (a DSPy LM may be a base model), which
    leaves DP-ES with its rule edits and public demonstrations. Token counts are estimates
    (4 UTF-8 bytes per token). It gives no log-probabilities.
    """

    def __init__(self, lm: Any, *, instruction_following: bool = False) -> None:
        super().__init__()
        if not callable(lm):
            raise TypeError(f"lm: expected a dspy.LM, got {type(lm).__name__}")
        self.lm = lm
        self.instruction_following = bool(instruction_following)
        self.model_string = str(getattr(lm, "model", type(lm).__name__))

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
        text = f"{system_prompt}\n\n{prompt}" if system_prompt else prompt
        settings: dict[str, Any] = {"temperature": temperature, "max_tokens": max_tokens}
        if stop:
            settings["stop"] = list(stop)
        with self._timed() as timing:
            output = _first_text(self.lm(text, **settings))
        self._count(
            prompt_tokens=estimated_tokens(text), completion_tokens=estimated_tokens(output), seconds=timing["seconds"]
        )
        return output

    def score_choices_batch(self, prefix: str, suffixes: Sequence[str], choices: Sequence[str]) -> np.ndarray:
        raise NotImplementedError("DSPyLMEngine: a DSPy LM gives no log-probabilities; DPES scores with the program")

    def token_logprobs(self, text: str, context: str = "") -> TokenLogprobs:
        raise NotImplementedError("DSPyLMEngine: a DSPy LM gives no log-probabilities")


__all__ = ["DEFAULT_MAX_TOKENS", "DSPyLMEngine", "EngineLM", "batches_candidates", "request_text"]
