"""`import dp_textgrad` (and loading DPEvolutionStrategy, which imports textgrad) writes
no file and makes no network attempt."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from tests.subprocess_driver import run_driver

PROBE_IMPORTS = "import socket, sys"
PROBE = textwrap.dedent(
    """
    attempts = []
    real_connect = socket.socket.connect
    def guarded(self, address):
        attempts.append(repr(address))
        raise OSError("network disabled in test")
    socket.socket.connect = guarded
    real_getaddrinfo = socket.getaddrinfo
    def no_dns(*args, **kwargs):
        attempts.append("dns:" + repr(args[0]))
        raise OSError("dns disabled in test")
    socket.getaddrinfo = no_dns
    import dp_textgrad
    from dp_textgrad import DPEvolutionStrategy
    import logging
    handlers = [h for h in logging.getLogger("textgrad").handlers if isinstance(h, logging.FileHandler)]
    print("LITELLM_LOADED", "litellm" in sys.modules)  # deferred: most of textgrad's import time
    # textgrad's LiteLLMEngine still reaches litellm: its `completion` imports it on first call.
    import types
    from textgrad.engine_experimental import litellm as textgrad_litellm
    fake = types.ModuleType("litellm")
    fake.completion = lambda **kwargs: "forwarded " + kwargs["model"]
    sys.modules["litellm"] = fake
    print("CALL", textgrad_litellm.completion(model="m1", messages=[]))
    del sys.modules["litellm"]
    import litellm  # the real one, loaded after textgrad: still offline
    print("ATTEMPTS", len(attempts), attempts)
    print("FILEHANDLERS", len(handlers))
    """
)


def _snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_import_writes_nothing_and_stays_offline(tmp_path: Path) -> None:
    home = tmp_path / "home"
    work = tmp_path / "work"
    tmpdir = tmp_path / "tmp"
    for d in (home, work, tmpdir):
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in {"TEXTGRAD_LOG_DIR", "LITELLM_LOCAL_MODEL_COST_MAP"}}
    env.update(HOME=str(home), TMPDIR=str(tmpdir), PYTHONDONTWRITEBYTECODE="1")
    before = {d: _snapshot(d) for d in (home, work, tmpdir)}
    proc = run_driver(PROBE_IMPORTS, PROBE, cwd=work, env=env, timeout=180)
    assert "ATTEMPTS 0" in proc.stdout, proc.stdout
    assert "LITELLM_LOADED False" in proc.stdout and "CALL forwarded m1" in proc.stdout, proc.stdout
    assert "FILEHANDLERS 0" in proc.stdout, proc.stdout
    for d in (home, work, tmpdir):
        assert _snapshot(d) == before[d], f"files appeared under {d.name}: {_snapshot(d) - before[d]}"
    assert not (work / "logs").exists()


def test_textgrad_records_never_reach_the_applications_handlers() -> None:
    """textgrad logs prompts (private records under TGD) in ``extra``: a root handler must not see them."""
    import logging

    from dp_textgrad._textgrad import import_textgrad

    seen: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    root = logging.getLogger()
    collector = Collect(level=logging.DEBUG)
    root.addHandler(collector)
    try:
        import_textgrad()
        logging.getLogger("textgrad").error("probe", extra={"text": "a private record"})
        logging.getLogger("other").error("control")
    finally:
        root.removeHandler(collector)
    assert [r.getMessage() for r in seen] == ["control"]
