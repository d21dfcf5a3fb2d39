"""Import TextGrad without its side effects.

textgrad 0.1.8 creates ``./logs/<timestamp>.jsonl`` at import time and logs every
prompt into it (prompts here contain private records), and litellm, which it
imports, fetches a model cost map from the network. We point both at harmless
places, detach textgrad's file handler and delete the directory it made. Its logger
also stops propagating: its records carry prompts in ``extra`` fields, which an
application's own root handler (a JSON formatter, say) would print.

textgrad imports litellm only for ``LiteLLMEngine`` (``from litellm import completion``),
and litellm's import is most of the cost of importing textgrad (14 s of 17 s on a busy
2-core machine): every CLI start paid it. Unless litellm is loaded already, textgrad gets
a ``completion`` that imports the real litellm on its first call, so its engine still works.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import sys
import tempfile
import threading
from types import ModuleType

_lock = threading.Lock()


def import_textgrad() -> ModuleType:
    """Return the ``textgrad`` module, imported so that it writes nothing and stays offline."""
    if "textgrad" in sys.modules:
        module = sys.modules["textgrad"]
        _detach_file_handlers()
        return module
    with _lock:
        if "textgrad" in sys.modules:
            return sys.modules["textgrad"]
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        previous_log_dir = os.environ.get("TEXTGRAD_LOG_DIR")
        scratch = tempfile.mkdtemp(prefix="dp-textgrad-tglog-")
        os.environ["TEXTGRAD_LOG_DIR"] = scratch
        deferred = "litellm" not in sys.modules
        if deferred:
            sys.modules["litellm"] = _deferred_litellm()
        try:
            module = importlib.import_module("textgrad")
        finally:
            if deferred and isinstance(sys.modules.get("litellm"), _DeferredLitellm):
                del sys.modules["litellm"]  # the next `import litellm` loads the real one
            if previous_log_dir is None:
                os.environ.pop("TEXTGRAD_LOG_DIR", None)
            else:
                os.environ["TEXTGRAD_LOG_DIR"] = previous_log_dir
            _detach_file_handlers()
            shutil.rmtree(scratch, ignore_errors=True)
        return module


class _DeferredLitellm(ModuleType):
    """Stands in for litellm while textgrad imports; only ``completion`` is ever taken from it."""

    def __getattr__(self, name: str):
        raise AttributeError(f"litellm.{name}: litellm is imported lazily by dp-textgrad; import litellm itself")


def _deferred_litellm() -> ModuleType:
    stand_in = _DeferredLitellm("litellm")

    def completion(*args, **kwargs):
        return importlib.import_module("litellm").completion(*args, **kwargs)

    stand_in.completion = completion  # type: ignore[attr-defined]
    return stand_in


def _detach_file_handlers() -> None:
    logger = logging.getLogger("textgrad")
    logger.propagate = False
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())  # and no last-resort printing to stderr
    for handler in list(logger.handlers):
        if isinstance(handler, logging.FileHandler):
            logger.removeHandler(handler)
            handler.close()
