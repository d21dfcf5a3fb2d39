"""Import DSPy offline: litellm, which DSPy imports, would fetch a model cost map from the
network unless told to read its local copy."""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any


def import_dspy(module: str = "dspy") -> Any:
    """Return the ``dspy`` module, or one of its submodules (``"dspy.lm15"``), imported offline.
    DSPy is installed by the ``dp-textgrad[dspy]`` extra."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if importlib.util.find_spec("dspy") is not None:
            raise  # DSPy is there and failed on its own: its error says why
        raise ImportError("dp_textgrad.integrations.dspy needs DSPy: pip install 'dp-textgrad[dspy]'") from exc
