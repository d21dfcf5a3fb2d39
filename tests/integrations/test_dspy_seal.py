"""The seal around DPES's private calls is structural: DSPy's response cache and the log handlers
are closed to a private call whatever the program does (issue 47, items 3 and 4).

- **The cache.** However a call asks for DSPy's response cache (the LM's ``cache=True``, a
  call-time ``config={"cache": True}`` on a predictor, an LM the program holds and switches in
  with ``dspy.context``), no private request or output reaches DSPy's memory cache or its disk
  cache (a directory of the test's), and the LM the program holds keeps no history and calls no
  callback. A public call on another thread, during a private call, keeps its cache. Each check
  has its control: the same program run outside DPES puts the private record in the cache.
- **The logs.** A logger first made during a private call (a library that makes its logger
  lazily) gets no record to the root's handlers, while a record of another thread during the
  call, or of the same thread after it, goes through.

Every model is a fake (``test_dspy_privacy.KeywordEngine`` behind ``dspy.LM``): seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

dspy = pytest.importorskip("dspy", reason="needs the [dspy] extra: pip install -e '.[dspy]'")

from tests.integrations.test_dspy_privacy import (  # noqa: E402
    CANARY_NEEDLES,
    KeywordEngine,
    LogCapture,
    SpyCache,
    SpyCallback,
    canary_trainset,
    captured_logs,
    example,
    files_holding,
    found_in,
    label_metric,
    public_records,
    saved_json,
)

#: Private records without a keyword: the fake model answers each with its first word, so that the
#: output (the value DSPy's cache would store), too, holds private text.
PARROTS = [example(f"zqprivparrot{i} says hello", "tech") for i in range(4)]
PRIVATE_NEEDLES = (*CANARY_NEEDLES, *(f"zqprivparrot{i}" for i in range(4)))
PUBLIC_PROBE = "zqpublicprobe hello there"  # no keyword: the model parrots "zqpublicprobe"


def keyword_lm(engine: KeywordEngine, **kwargs: Any) -> Any:
    return dspy.LM("keyword/fake", engine=engine, async_engine=AsyncKeywordEngine(engine), **kwargs)


class AsyncKeywordEngine:
    """The async counterpart of a :class:`KeywordEngine` (DSPy's ``acall`` path)."""

    def __init__(self, engine: KeywordEngine) -> None:
        self.engine = engine

    async def complete(self, request: Any) -> Any:
        return self.engine.complete(request)

    async def aclose(self) -> None:
        pass


# -- programs that ask for DSPy's cache themselves ------------------------------------------------------
class CallTimeCache(dspy.Module):
    """Asks DSPy's response cache for each call of its predictor at call time."""

    def __init__(self) -> None:
        super().__init__()
        self.predict = dspy.Predict("sentence -> label")

    def forward(self, sentence: Any) -> Any:
        return self.predict(sentence=sentence, config={"cache": True})


class HeldLM(dspy.Module):
    """Holds its own LM (cache on, a callback) and switches it in with ``dspy.context``."""

    def __init__(self, lm: Any) -> None:
        super().__init__()
        self.model = lm
        self.predict = dspy.Predict("sentence -> label")

    def forward(self, sentence: Any) -> Any:
        with dspy.context(lm=self.model):
            return self.predict(sentence=sentence)


@contextlib.contextmanager
def dspy_cache_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SpyCache]:
    """DSPy's two-level cache (memory, and disk in ``tmp_path/cache``) as ``dspy.cache``, keeping
    every request it is asked for; ``DSPY_CACHEDIR`` points into ``tmp_path`` too, so that
    nothing here touches ``~/.dspy_cache``. Undone after."""
    monkeypatch.setenv("DSPY_CACHEDIR", str(tmp_path / "default_cache"))
    cache = SpyCache(tmp_path / "cache")
    monkeypatch.setitem(vars(dspy), "cache", cache)
    try:
        yield cache
    finally:
        cache.disk_cache.close()


def cache_channels(cache: SpyCache, tmp_path: Path) -> dict[str, bytes]:
    """What DSPy's cache holds: the requests it was asked for (its keys are their hashes), its
    memory entries, its disk files and those of DSPy's default directory."""

    def files(root: Path) -> bytes:
        return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()) if root.exists() else b""

    return {
        "cache requests": "\n".join(cache.requests).encode(),
        "memory cache": repr(list(cache.memory_cache.values())).encode(),
        "disk cache": files(tmp_path / "cache"),
        "default cache dir": files(tmp_path / "default_cache"),
    }


def seen(channels: dict[str, bytes], needles: Any) -> dict[str, list[str]]:
    return {name: hits for name, data in channels.items() if (hits := found_in(data, list(needles)))}


# -- 1. the canary, with each way of asking for the cache --------------------------------------------------
def build_variant(variant: str) -> tuple[Any, Any, list[KeywordEngine], Any]:
    """(the student, DPES's ``lm``, the engines that answer private calls, the program's own LM or None)."""
    if variant == "default":  # DSPy's default: the LM caches every call
        engine = KeywordEngine()
        lm = keyword_lm(engine, cache=True)
        return dspy.Predict("sentence -> label"), lm, [engine], None
    if variant == "call-time cache":  # the LM does not cache; the predictor's call asks for it
        engine = KeywordEngine()
        lm = keyword_lm(engine, cache=False)
        return CallTimeCache(), lm, [engine], None
    held_engine, engine = KeywordEngine(), KeywordEngine()
    held = keyword_lm(held_engine, cache=True, callbacks=[SpyCallback()])
    return HeldLM(held), keyword_lm(engine, cache=False), [held_engine], held


@pytest.mark.parametrize("variant", ["default", "call-time cache", "program-held LM"])
def test_dpes_never_releases_the_canary_nor_caches_a_private_call(variant, tmp_path, monkeypatch) -> None:
    from dp_textgrad.integrations.dspy import DPES

    student, lm, engines, held = build_variant(variant)
    out, err = io.StringIO(), io.StringIO()
    with (
        dspy_cache_in(tmp_path, monkeypatch) as cache,
        captured_logs() as logs,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        optimizer = DPES(
            label_metric,
            auto=None,
            generations=2,
            population=3,
            parents=2,
            public_trainset=public_records(),
            lm=lm,
            instruction_following=True,
            runs_root=tmp_path / "runs",
        )
        compiled = optimizer.compile(student, trainset=canary_trainset() + PARROTS)
        during = cache_channels(cache, tmp_path)
        saved = saved_json(compiled, tmp_path / "program.json")
        assert sum(engine.private_calls for engine in engines) > 0  # the private records were run
        held_channels = [repr(held.history), "\n".join(held.callbacks[0].seen)] if held is not None else []
        # Power: after the compile the spies are live, and a public call of the program reaches the cache.
        with dspy.context(lm=lm):
            compiled(sentence=PUBLIC_PROBE)
        after = cache_channels(cache, tmp_path)
    leaked = seen(during, PRIVATE_NEEDLES)
    assert not leaked, f"a private call reached DSPy's cache ({variant}): {leaked}"
    assert {"cache requests", "memory cache", "disk cache"} <= set(seen(after, ["zqpublicprobe"]))
    assert not seen(after, PRIVATE_NEEDLES)
    if held is not None:  # the program's own LM ran the private calls with no history and no callback
        assert held_channels == ["[]", ""], held_channels
        assert found_in(repr(held.history), ["zqpublicprobe"])  # both are live: the public probe reached them
        assert found_in(repr(held.callbacks[0].seen), ["zqpublicprobe"])
        assert held.cache is True  # and the user's LM is left as it is
    assert '"differentially_private": true' in saved
    assert not files_holding(tmp_path / "runs", PRIVATE_NEEDLES)
    released = {"program": saved, "console": out.getvalue() + err.getvalue(), "logs": "\n".join(logs.lines)}
    assert not {name: hits for name, text in released.items() if (hits := found_in(text, PRIVATE_NEEDLES))}

    # Control: the same program, run outside DPES on a private record, puts it in DSPy's cache.
    with dspy_cache_in(tmp_path / "control", monkeypatch) as control, dspy.context(lm=lm):
        student(sentence=PARROTS[0].sentence)
        assert {"cache requests", "memory cache", "disk cache"} <= set(
            seen(cache_channels(control, tmp_path / "control"), ["zqprivparrot0"])
        )


# -- 2. threads: a private call has no cache, a public one on another thread keeps it -------------------------
class WaitsInside(dspy.Module):
    """Calls its predictor with a call-time cache request, then waits (inside the call) until told
    to go on, then calls it again through DSPy's async path (``acall``, whose cache lookups run in
    a worker thread of asyncio)."""

    def __init__(self, inside: threading.Event, go_on: threading.Event) -> None:
        super().__init__()
        self.predict = dspy.Predict("sentence -> label")
        self.inside, self.go_on = inside, go_on

    def forward(self, sentence: Any) -> Any:
        self.predict(sentence=sentence, config={"cache": True})
        self.inside.set()
        assert self.go_on.wait(10)
        return asyncio.run(self.predict.acall(sentence=sentence + " again", config={"cache": True}))

    def __deepcopy__(self, memo: dict[int, Any]) -> WaitsInside:  # the events are shared by the copies
        copied = WaitsInside(self.inside, self.go_on)
        copied.predict = self.predict.deepcopy()
        return copied


def test_a_private_call_has_no_cache_while_a_public_thread_keeps_its_own(tmp_path, monkeypatch) -> None:
    from dp_textgrad.integrations.dspy.program_task import PromptParts, SealedProgram, SilencedPrivateCalls

    module_type = type(dspy)
    inside, go_on = threading.Event(), threading.Event()
    engine = KeywordEngine()
    lm = keyword_lm(engine, cache=True)
    errors: list[BaseException] = []
    with dspy_cache_in(tmp_path, monkeypatch) as cache:
        with SilencedPrivateCalls() as silencer:
            sealed = SealedProgram(WaitsInside(inside, go_on), PromptParts(["predict"], {}), lm, None, silencer)

            def private() -> None:
                try:
                    sealed.run("Label the sentence.", {"sentence": "zqprivparrot0 says hello"})
                except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                    errors.append(exc)
                    inside.set()

            worker = threading.Thread(target=private)
            worker.start()
            assert inside.wait(10)
            with dspy.context(lm=lm):  # a public call, on this thread, while the private one is running
                dspy.Predict("sentence -> label")(sentence=PUBLIC_PROBE)
            go_on.set()
            worker.join(10)
        assert not errors, errors
        assert engine.private_calls == 2 and engine.calls == 3  # both private calls were made, and the public one
        channels = cache_channels(cache, tmp_path)
        assert not seen(channels, ["zqprivparrot0"]), seen(channels, ["zqprivparrot0"])
        assert {"cache requests", "memory cache", "disk cache"} <= set(seen(channels, ["zqpublicprobe"]))
        assert vars(dspy)["cache"] is cache and type(dspy) is module_type  # the seal is taken away


class HeldEverywhere(HeldLM):
    """Holds its LM in a list in a dict too, and a lock: it cannot be deep-copied, so DSPy copies
    it attribute by attribute (sharing what fails, such as the dict holding the LM)."""

    def __init__(self, lm: Any) -> None:
        super().__init__(lm)
        self.spares = {"models": [lm]}
        self.lock = threading.Lock()

    def forward(self, sentence: Any) -> Any:
        with dspy.context(lm=self.spares["models"][0]):
            return self.predict(sentence=sentence)


@pytest.mark.parametrize("program_class", [HeldLM, HeldEverywhere])
def test_every_lm_a_program_holds_runs_as_a_sealed_copy_and_the_users_stays_as_it_is(program_class) -> None:
    from dp_textgrad.integrations.dspy.program_task import PromptParts, SealedProgram, SilencedPrivateCalls

    engine = KeywordEngine()
    held = keyword_lm(engine, cache=True, callbacks=[SpyCallback()])
    program = program_class(held)
    # No compile around it: the private call holds the seal itself.
    sealed = SealedProgram(program, PromptParts(["predict"], {}), keyword_lm(KeywordEngine()), None, SilencedPrivateCalls())
    lms = [lm for _, lm in sealed.template.named_sub_modules(type_=dspy.BaseLM)]
    assert lms and all(lm is not held and lm.cache is False and lm.callbacks == [] for lm in lms)
    for _ in range(2):
        assert sealed.run("Label the sentence.", {"sentence": "zqprivparrot0 says hello"}).label == "zqprivparrot0"
    assert engine.private_calls == 2  # the program's own LM answered, through its sealed copy
    assert held.callbacks[0].seen == [] and held.history == [] and held.cache is True
    assert [lm for _, lm in program.named_sub_modules(type_=dspy.BaseLM)] == [held]  # the user's program


# -- 3. the logs: a logger made during a private call ---------------------------------------------------------
@contextlib.contextmanager
def root_capture() -> Iterator[LogCapture]:
    capture = LogCapture()
    root = logging.getLogger()
    level = root.level
    root.addHandler(capture)
    root.setLevel(logging.DEBUG)
    try:
        yield capture
    finally:
        root.removeHandler(capture)
        root.setLevel(level)


def test_a_logger_first_made_during_a_private_call_reaches_no_root_handler() -> None:
    from dspy.utils.parallelizer import ParallelExecutor

    from dp_textgrad.integrations.dspy.program_task import SilencedPrivateCalls

    secret = "zqprivlazy Wilhelmina"
    name = f"lazy_library_{uuid.uuid4().hex}"  # a logger nobody has made yet
    assert name not in logging.root.manager.loggerDict
    handle = logging.Handler.handle
    inside, go_on = threading.Event(), threading.Event()

    def public_thread() -> None:  # logs while the private call is running, on its own thread
        assert inside.wait(10)
        logging.getLogger(name).warning("public record of another thread")
        go_on.set()

    with root_capture() as capture, SilencedPrivateCalls() as silencer:
        other = threading.Thread(target=public_thread)
        other.start()
        with silencer.private_call():
            logging.getLogger(name).warning("first record: %s", secret)  # the logger is made here
            inside.set()
            assert go_on.wait(10)
            logging.getLogger(name).error("second record: %s", secret)
            logging.getLogger(f"another_{name}.child").info("third: %s", secret)
            # Threads DSPy starts for the call (dspy.Parallel's executor) carry its context: dropped too.
            ParallelExecutor(num_threads=2, disable_progress_bar=True).execute(
                lambda i: logging.getLogger(name).warning("worker %s: %s", i, secret), [0, 1]
            )
        other.join(10)
        logging.getLogger(name).warning("public record after the call")
    assert not found_in("\n".join(capture.lines), [secret]), capture.lines
    assert f"{name} WARNING public record of another thread" in capture.lines
    assert f"{name} WARNING public record after the call" in capture.lines
    assert logging.Handler.handle is handle  # the drop is taken away with the seal


class LazyLogging(dspy.Module):
    """A program whose library makes its logger (``logger_name``) on first use, and logs the input."""

    def __init__(self, logger_name: str) -> None:
        super().__init__()
        self.predict = dspy.Predict("sentence -> label")
        self.logger_name = logger_name

    def forward(self, sentence: Any) -> Any:
        logging.getLogger(self.logger_name).warning("classifying %s", sentence)
        return self.predict(sentence=sentence)


def test_a_program_whose_logger_is_made_lazily_logs_nothing_under_dpes(tmp_path) -> None:
    from dp_textgrad.integrations.dspy import DPES

    name = f"lazy_library_{uuid.uuid4().hex}.made_in_forward"
    assert name not in logging.root.manager.loggerDict
    engine = KeywordEngine()
    with root_capture() as capture:
        DPES(
            label_metric,
            auto=None,
            generations=1,
            population=2,
            parents=1,
            insecure_noise_seed=1,
            lm=keyword_lm(engine, cache=False),
            runs_root=tmp_path / "runs",
        ).compile(LazyLogging(name), trainset=canary_trainset() + PARROTS)
        assert engine.private_calls > 0
        assert not found_in("\n".join(capture.lines), PRIVATE_NEEDLES), capture.lines
        with dspy.context(lm=keyword_lm(KeywordEngine(), cache=False)):
            LazyLogging(name)(sentence=PUBLIC_PROBE)  # control: outside DPES the record goes through
    assert any("zqpublicprobe" in line for line in capture.lines)


# -- 4. a metric that calls an LM (an LLM judge) ---------------------------------------------------------------
def test_a_metric_that_calls_dspy_reaches_no_side_channel(tmp_path, monkeypatch) -> None:
    from dp_textgrad.integrations.dspy import DPES
    from tests.integrations.test_dspy_privacy import private_records, spies

    judge = dspy.Predict("sentence -> label")  # runs on DSPy's configured LM, as a judge metric does

    def judged(example: Any, prediction: Any, trace: Any = None) -> float:
        return float(judge(sentence=example.sentence).label == example.label)

    private = private_records(6)
    needles = [f"zqpriv{i}" for i in range(6)]
    with spies(tmp_path, monkeypatch) as watch:
        program_engine = KeywordEngine()
        DPES(
            judged,
            auto=None,
            generations=1,
            population=2,
            parents=1,
            lm=keyword_lm(program_engine, cache=False),
            runs_root=tmp_path / "runs",
        ).compile(dspy.Predict("sentence -> label"), trainset=private)
        assert program_engine.private_calls > 0 and watch.engine.private_calls > 0  # the judge ran on them
        during = watch.seen(needles)
        judged(public_records()[0], dspy.Prediction(label="bill"))  # control: the spies see a public call
    assert not during, f"the metric's DSPy calls reached side channels: {during}"
    assert {"global callback", "LM callback", "global history", "cache requests"} <= set(
        watch.seen(["extra fee on my invoice"])
    )
