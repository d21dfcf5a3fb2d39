"""The DP guarantee a compiled DSPy program carries, and how it survives ``save``/``load``.

DSPy saves a program as the JSON state of its predictors and loads that state into a FRESH
instance of the user's class, so only a predictor's state can carry the guarantee into it:
``Predict.load_state`` sets every key it does not know as an attribute of the predictor. The
optimized predictor of a compiled program therefore dumps one more key, ``"dp_guarantee"``
(public values only), and after ``fresh.load(path)`` the fresh predictor holds it as a dict;
:meth:`DPGuarantee.of` (:mod:`dp_textgrad.integrations.guarantee`) finds it in either program.
"""

from __future__ import annotations

from typing import Any

from dp_textgrad.integrations.guarantee import STATE_KEY, DPGuarantee


class _DumpsGuarantee:
    """Mixin of the optimized predictor: its saved state holds the guarantee too."""

    def dump_state(self, json_mode: bool = True) -> dict[str, Any]:
        state: dict[str, Any] = super().dump_state(json_mode=json_mode)  # type: ignore[misc]
        guarantee = getattr(self, STATE_KEY, None)
        if isinstance(guarantee, DPGuarantee):
            state[STATE_KEY] = guarantee.as_dict()
        elif isinstance(guarantee, dict):
            state[STATE_KEY] = dict(guarantee)
        return state


def attach_guarantee(program: Any, predictor: Any, guarantee: DPGuarantee) -> None:
    """Give ``program`` its guarantee, and make ``predictor`` (one of its own) save it.

    The predictor's class becomes a subclass of its own class with the same name that adds the
    guarantee to ``dump_state``: ``isinstance`` checks, ``repr`` and behaviour are unchanged."""
    program.dp_guarantee = guarantee
    predictor.dp_guarantee = guarantee
    base = type(predictor)
    if not issubclass(base, _DumpsGuarantee):
        predictor.__class__ = type(base.__name__, (_DumpsGuarantee, base), {"__module__": __name__})


__all__ = ["STATE_KEY", "DPGuarantee", "attach_guarantee"]
