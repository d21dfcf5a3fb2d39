"""Checks on public inputs before the first charge: the engine's server is there (engines
with ``check_reachable``, one request without retries), the engine answers, a record fits
(for a generation task: with its public ``max_new_tokens`` after it).

The probe is made only of public text (a run of the word "word" cut to the record-length
cap), so any error it raises may be shown as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


class PreflightError(RuntimeError):
    """The engine, the context window or the run directory failed a check on public inputs,
    before anything was charged."""


def length_tools(engine: Any) -> tuple[Callable[[str], int], Callable[[str, int], str]]:
    """The engine's token counter and truncation; a byte-based estimate for engines without them."""
    from dp_textgrad.engines.base import estimated_tokens, truncate_estimated

    count = getattr(engine, "count_tokens", None)
    truncate = getattr(engine, "truncate_to_tokens", None)
    if callable(count) and callable(truncate):
        return count, truncate
    return estimated_tokens, truncate_estimated


def preflight(engine: Any, task: Any, prompt: str, max_record_tokens: int) -> None:
    """Raise :class:`PreflightError` unless the engine's server can be reached, a record of
    ``max_record_tokens`` tokens after ``prompt`` fits the engine's context and the engine
    scores a public probe sanely."""
    check_reachable = getattr(engine, "check_reachable", None)
    if callable(check_reachable):  # a server that is not there fails now, not after minutes of retries
        try:
            check_reachable()
        except Exception as exc:  # its text names the public URL only
            raise PreflightError(
                f"preflight: the engine's server cannot be reached, before anything was charged: "
                f"{' '.join(str(exc).split())}"
            ) from None
    if hasattr(task, "probe"):  # a task scored by the caller's pipeline (tasks.scored) checks itself, if it can
        try:
            if callable(task.probe):
                task.probe(prompt)
        except Exception as exc:  # public probe: its error text holds no private data
            raise PreflightError(
                f"preflight: the task's pipeline failed on a public probe before anything was charged "
                f"({type(exc).__name__}: {' '.join(str(exc).split())})"
            ) from None
        return
    count_tokens, truncate = length_tools(engine)
    cap = max_record_tokens
    probe = truncate(" ".join(["word"] * (2 * cap)), cap)
    try:  # a generation prompt's own record format (tasks.record_format) must be well formed
        prefix = task.render_prefix(prompt)
    except ValueError as exc:  # public text: the seed prompt
        raise PreflightError(f"preflight: the seed {exc}") from None
    context = getattr(engine, "context_tokens", None)
    generating = getattr(task, "kind", "classify") == "generate"
    if context is not None:
        if generating:  # the output's public cap must fit after the longest record
            tail, tail_name = int(task.max_new_tokens), f"task max_new_tokens = {task.max_new_tokens}"
        else:
            tail, tail_name = max(count_tokens(v) for v in task.verbalizers.values()) + 1, "the longest label"
        record = task.render_record(probe, prompt) if generating else task.render_record(probe)
        needed = count_tokens(prefix) + count_tokens(record) + tail
        if needed > context:
            raise PreflightError(
                f"preflight: a record of dp.max_record_tokens = {cap} tokens after the seed prompt, with "
                f"{tail_name}, needs about {needed} tokens but the engine's context holds {context}; lower "
                "dp.max_record_tokens" + (" or max_new_tokens" if generating else "") + " or raise the engine's "
                "context (n_ctx)"
            )
    if generating:
        _probe_generation(engine, task, prompt, probe)
        return
    choices = [task.verbalizers[label] for label in task.labels]
    # An engine with ``probe_scores`` (the OpenAI one) probes with one short attempt per
    # request, so a scoring route its server cannot serve fails in seconds, naming the fix.
    probe_scores = getattr(engine, "probe_scores", None)
    score = probe_scores if callable(probe_scores) else engine.score_choices_batch
    try:
        scores = np.asarray(score(prefix, [task.render_record(probe)], choices))
    except Exception as exc:  # public probe: its error text holds no private data
        raise PreflightError(
            f"preflight: the engine failed on a public probe before anything was charged "
            f"({type(exc).__name__}: {' '.join(str(exc).split())})"
        ) from None
    if scores.shape != (1, len(choices)) or not np.all(np.isfinite(scores)):
        raise PreflightError(
            "preflight: the engine returned malformed scores for a public probe "
            f"(shape {scores.shape}); check the engine"
        )


def _probe_generation(engine: Any, task: Any, prompt: str, probe: str) -> None:
    """One short public generation, so an engine that cannot generate fails before any charge."""
    try:
        outputs = engine.generate_after_prefix(
            task.render_prefix(prompt),
            [task.render_record(probe, prompt)],
            max_tokens=min(4, int(task.max_new_tokens)),
            stop=task.stop_for(prompt),
        )
    except Exception as exc:  # public probe: its error text holds no private data
        raise PreflightError(
            f"preflight: the engine failed to generate after a public probe before anything was charged "
            f"({type(exc).__name__}: {' '.join(str(exc).split())})"
        ) from None
    if not isinstance(outputs, list) or len(outputs) != 1 or not isinstance(outputs[0], str):
        raise PreflightError(
            "preflight: the engine returned a malformed generation for a public probe; check the engine"
        )


__all__ = ["PreflightError", "length_tools", "preflight"]
