"""Privacy of the DSPy optimizer (``dp_textgrad.integrations.dspy.DPES``) seen from DSPy's side.

Three things are shown, each next to a control that proves the check can fail:

- **The canary.** A private trainset holds one record with a unique string. DSPy's stock
  ``LabeledFewShot`` and ``BootstrapFewShot`` copy it verbatim into the compiled program's
  demonstrations (its saved JSON); ``DPES`` on the same trainset never releases it: not in the
  saved JSON, the run directory, the runs root, the console, the logs, the guarantee.
- **The twin run on the DSPy path.** ``DPES.compile`` on D and on D plus one long record (300
  words, whose program call is slow and reports many tokens), with the noise seeded and the
  size count (and the failure histogram, when LLM rewrites read it) coupled as in
  ``tests/twin.py``: every released file of the run directory, the compiled program's saved
  JSON and guarantee, the console, the logs, DSPy's history of the compile and the observers'
  events are byte-identical, and the long record was run through the program.
  Planting a leak of a private count into a released field makes the comparison fail.
- **DSPy's side channels.** While ``DPES`` scores private records, a callback registered with
  ``dspy.configure(callbacks=[...])``, a callback on the LM, DSPy's history (the global one, the
  LM's, the program's), its global trace, its response cache (memory and disk), its usage
  tracker and its logs never see a private record (with one thread or two). The same program
  evaluated on the same records by DSPy's stock ``Evaluate`` shows that each of these channels
  does see them when nothing keeps them out, and a stock optimizer's compile hands the
  trainset to the global callback's ``on_compile_start``.

Every model here is a fake (a canonical DSPy engine behind ``dspy.LM``), so the module runs
in seconds; the real llama.cpp server is exercised by ``test_dspy_server.py``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

dspy = pytest.importorskip("dspy", reason="needs the [dspy] extra: pip install -e '.[dspy]'")

from dspy.clients.cache import Cache  # noqa: E402
from dspy.lm15 import Message, Response, TextPart, Usage  # noqa: E402
from dspy.utils.callback import BaseCallback  # noqa: E402

from tests.twin import EventRecorder, collect, couple_size_count, differences, json_differences  # noqa: E402

# -- the fake model ---------------------------------------------------------------------------------
LABELS = ("bill", "tech", "fraud")
CUES = {
    "bill": "I was charged twice for my plan",
    "tech": "the app crashes when I open it",
    "fraud": "someone used my stolen card",
}
KEYWORDS = {"charged": "bill", "crashes": "tech", "stolen": "fraud"}
INSTRUCTION_REPLY = "Read the sentence and answer with its label: bill, tech or fraud."
SLOW_MARKER = "zqxjslow"  # the twin's long record: the model takes long and reports many tokens
GARBLE_MARKER = "zqxjgarble"  # the model answers such a record with text no adapter can parse
PRIVATE_TAG = "zqpriv"  # in every private record of these tests, in no public text
PRIVATE_USAGE_TOKENS = 1_000_000  # what the model reports for a request holding PRIVATE_TAG
SENTENCE_FIELD = re.compile(r"\[\[ ## sentence ## \]\]\s*\n(.*?)(?:\n\n|\n\[\[|$)", re.S)


def field_reply(label: str) -> str:
    """The reply DSPy's ChatAdapter parses into ``label``."""
    return f"[[ ## label ## ]]\n{label}\n\n[[ ## completed ## ]]"


class KeywordEngine:
    """A canonical DSPy engine (``dspy.LM(..., engine=KeywordEngine())``): goes through DSPy's
    cache, history, callbacks and usage tracking like a real provider.

    The label of a sentence is the one whose keyword it holds; a sentence without a keyword is
    answered with its own first word (a small model parroting its input, so that outputs, too,
    can carry private text). A sentence with :data:`SLOW_MARKER` takes ``seconds_per_word`` per
    word and is labelled ``"none"``; one with :data:`GARBLE_MARKER` gets an unparseable reply. A
    request without a sentence field (an instruction rewrite) gets :data:`INSTRUCTION_REPLY`.
    Usage reports one input token per word of the request, plus :data:`PRIVATE_USAGE_TOKENS`
    when the request holds :data:`PRIVATE_TAG` (so a usage total shows whether a private call
    was counted in it).
    """

    seconds_per_word = 0.0005

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0
        self.slow_calls = 0  # calls on a record holding SLOW_MARKER (the twin's long record was scored)
        self.private_calls = 0  # calls whose request holds PRIVATE_TAG (private records were run)

    def complete(self, request: Any) -> Response:
        texts = [part.text for part in _system_parts(request)] + [m.text or "" for m in request.messages]
        prompt = "\n".join(texts)
        with self.lock:
            self.calls += 1
            self.private_calls += PRIVATE_TAG in prompt
        last = request.messages[-1].text or "" if request.messages else ""
        found = SENTENCE_FIELD.search(last)
        if found is None:
            reply = INSTRUCTION_REPLY
        else:
            sentence = found.group(1).strip()
            if SLOW_MARKER in sentence:
                with self.lock:
                    self.slow_calls += 1
                time.sleep(self.seconds_per_word * len(sentence.split()))
                reply = field_reply("none")
            elif GARBLE_MARKER in sentence:
                reply = "I cannot say."
            else:
                hits = [label for word, label in KEYWORDS.items() if word in sentence]
                reply = field_reply(hits[0] if hits else (sentence.split() or ["none"])[0])
        words = len(prompt.split()) + (PRIVATE_USAGE_TOKENS if PRIVATE_TAG in prompt else 0)
        return Response(
            id=None,
            model="keyword",
            message=Message.assistant([TextPart(reply)]),
            finish_reason="stop",
            usage=Usage(input_tokens=words, output_tokens=3, total_tokens=words + 3),
        )

    def close(self) -> None:
        pass


def _system_parts(request: Any) -> list[Any]:
    system = getattr(request, "system", None)
    if system is None:
        return []
    return [TextPart(system)] if isinstance(system, str) else list(system)


def keyword_lm(**kwargs: Any) -> Any:
    """A ``dspy.LM`` on :class:`KeywordEngine` (no network, DSPy's cache on by default)."""
    return dspy.LM("keyword/fake", engine=KeywordEngine(), **kwargs)


def label_metric(example: Any, prediction: Any, trace: Any = None) -> float:
    """A DSPy user's metric, with DSPy's signature: 1.0 when the label is right."""
    return float(str(getattr(prediction, "label", "")).strip() == example.label)


def classifier(signature: str = "sentence -> label") -> Any:
    return dspy.Predict(signature)


#: The side-channel tests' classifier: a typed input field, so that DSPy checks input types.
TYPED = "sentence: str -> label"


def example(sentence: Any, label: str) -> Any:
    return dspy.Example(sentence=sentence, label=label).with_inputs("sentence")


def private_records(n: int) -> list[Any]:
    """``n`` private records, each with a unique tag (``zqpriv0``, ...) that no public text holds."""
    return [example(f"{CUES[LABELS[i % 3]]} {PRIVATE_TAG}{i}", LABELS[i % 3]) for i in range(n)]


PUBLIC_SENTENCES = {
    "bill": "Why is there an extra fee on my invoice? I was charged twice.",
    "tech": "My router crashes every evening.",
    "fraud": "My wallet was stolen with my card in it.",
}


def public_records() -> list[Any]:
    return [example(text, label) for label, text in PUBLIC_SENTENCES.items()]


# -- what a run let out: files, console, logs ----------------------------------------------------------
def found_in(data: bytes | str, needles: Sequence[str]) -> list[str]:
    """The needles that occur in ``data`` (text as UTF-8; pickles, as in DSPy's disk cache, hold
    strings as UTF-8 too)."""
    blob = data.encode("utf-8", "replace") if isinstance(data, str) else data
    return [needle for needle in needles if needle.encode() in blob]


def files_holding(root: Path, needles: Sequence[str]) -> dict[str, list[str]]:
    """Each file under ``root`` (relative path) that holds one of ``needles``, with those it holds."""
    out: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and (hits := found_in(path.read_bytes(), needles)):
            out[path.relative_to(root).as_posix()] = hits
    return out


class LogCapture(logging.Handler):
    """Every log record, formatted with its arguments (DSPy's loggers do not propagate: attach it
    to them and to the root). The plotting libraries' debug records are left out: they draw the
    report's plots from released files only, and their font search logs once per process."""

    ignored = ("matplotlib", "PIL")

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.split(".")[0] in self.ignored:
            return
        try:
            self.lines.append(f"{record.name} {record.levelname} {record.getMessage()}")
        except Exception as exc:  # noqa: BLE001 - a record that cannot be formatted is still seen
            self.lines.append(f"{record.name} {record.levelname} {record.msg!r} {record.args!r} ({exc})")


@contextlib.contextmanager
def captured_logs() -> Iterator[LogCapture]:
    capture = LogCapture()
    loggers = [logging.getLogger(), logging.getLogger("dspy"), logging.getLogger("dp_textgrad")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(capture)
        lg.setLevel(logging.DEBUG)
    try:
        yield capture
    finally:
        for lg, level in zip(loggers, levels):
            lg.removeHandler(capture)
            lg.setLevel(level)


# -- DSPy's side channels, each with a spy ----------------------------------------------------------
class SpyCallback(BaseCallback):
    """A DSPy callback that keeps the text of everything it is handed (inputs, outputs, instances)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def _keep(self, kind: str, *values: Any) -> None:
        self.seen.append(kind + " " + " ".join(repr(v) for v in values))

    def on_module_start(self, call_id, instance, inputs):
        self._keep("module_start", inputs)

    def on_module_end(self, call_id, outputs, exception=None):
        self._keep("module_end", outputs, exception)

    def on_lm_start(self, call_id, instance, inputs):
        self._keep("lm_start", inputs)

    def on_lm_end(self, call_id, outputs, exception=None):
        self._keep("lm_end", outputs, exception)

    def on_adapter_format_start(self, call_id, instance, inputs):
        self._keep("format_start", inputs)

    def on_adapter_format_end(self, call_id, outputs, exception=None):
        self._keep("format_end", outputs, exception)

    def on_adapter_parse_start(self, call_id, instance, inputs):
        self._keep("parse_start", inputs)

    def on_adapter_parse_end(self, call_id, outputs, exception=None):
        self._keep("parse_end", outputs, exception)

    def on_evaluate_start(self, call_id, instance, inputs):
        self._keep("evaluate_start", inputs)

    def on_evaluate_end(self, call_id, outputs, exception=None):
        self._keep("evaluate_end", outputs, exception)

    def on_compile_start(self, call_id, instance, inputs):
        self._keep("compile_start", inputs)

    def on_compile_end(self, call_id, outputs, exception=None):
        self._keep("compile_end", outputs, exception)


class SpyCache(Cache):
    """DSPy's own two-level response cache (memory and disk under ``directory``), keeping the text
    of every request it is asked to look up or store."""

    def __init__(self, directory: Path) -> None:
        super().__init__(enable_disk_cache=True, enable_memory_cache=True, disk_cache_dir=str(directory))
        self.requests: list[str] = []

    def get(self, request, ignored_args_for_cache_key=None):
        self.requests.append("get " + repr(request))
        return super().get(request, ignored_args_for_cache_key)

    def put(self, request, value, ignored_args_for_cache_key=None, enable_memory_cache=True):
        self.requests.append("put " + repr(request))
        return super().put(request, value, ignored_args_for_cache_key, enable_memory_cache)


@dataclass
class Spies:
    """Every DSPy channel a private record could reach, watched while a program runs."""

    engine: KeywordEngine
    lm: Any
    global_callback: SpyCallback
    lm_callback: SpyCallback
    cache: SpyCache
    cache_dir: Path
    default_cache_dir: Path
    logs: LogCapture
    usage: Any  # dspy's UsageTracker
    stdout: io.StringIO
    stderr: io.StringIO
    history_start: int
    trace_start: int
    programs: list[Any] = field(default_factory=list)

    def channels(self) -> dict[str, bytes]:
        """Each channel's text now (history from the point the spies were installed)."""
        from dspy.clients.base_lm import GLOBAL_HISTORY

        def history_text(entries: Sequence[dict]) -> str:
            return "\n".join(repr({k: e.get(k) for k in ("prompt", "messages", "outputs", "request")}) for e in entries)

        def cache_files(root: Path) -> bytes:
            return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())

        memory = getattr(self.cache, "memory_cache", {})
        program_history = [e for program in self.programs for m in _modules(program) for e in getattr(m, "history", [])]
        return {
            "global callback": "\n".join(self.global_callback.seen).encode(),
            "LM callback": "\n".join(self.lm_callback.seen).encode(),
            "global history": history_text(GLOBAL_HISTORY[self.history_start :]).encode(),
            "LM history": history_text(self.lm.history).encode(),
            "program history": history_text(program_history).encode(),
            # DSPy's global trace (settings.trace is a list by default): every Predict call appends to it
            "trace": repr(list(dspy.settings.trace or [])[self.trace_start :]).encode(),
            "cache requests": "\n".join(self.cache.requests).encode(),
            "memory cache": repr(list(memory.values())).encode(),
            "disk cache": cache_files(self.cache_dir),
            "default cache dir": cache_files(self.default_cache_dir),
            "usage tracker": "\n".join(
                f"a call counted, {entry.get('prompt_tokens')} prompt tokens"
                + (f" (a {PRIVATE_TAG} call)" if (entry.get("prompt_tokens") or 0) >= PRIVATE_USAGE_TOKENS else "")
                for entries in self.usage.usage_data.values()
                for entry in entries
            ).encode(),
            "logs": "\n".join(self.logs.lines).encode(),
            "stdout": self.stdout.getvalue().encode(),
            "stderr": self.stderr.getvalue().encode(),
        }

    def seen(self, needles: Sequence[str]) -> dict[str, list[str]]:
        """The channels that hold one of ``needles``, with the needles each holds."""
        return {name: hits for name, data in self.channels().items() if (hits := found_in(data, needles))}


def _modules(program: Any) -> list[Any]:
    return [program] + [module for _, module in program.named_sub_modules()]


@contextlib.contextmanager
def spies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Spies]:
    """Install a spy on every channel: a global callback (``dspy.configure``), a callback on the LM,
    DSPy's cache (memory + disk in ``tmp_path``; ``DSPY_CACHEDIR`` points there too), a usage
    tracker, the logs, stdout/stderr; the histories and DSPy's global trace are read from where
    they stand now. The LM (on a :class:`KeywordEngine`, DSPy's cache on) is the
    configured default LM. Restores all after."""
    from dspy.clients.base_lm import GLOBAL_HISTORY

    monkeypatch.setenv("DSPY_CACHEDIR", str(tmp_path / "default_cache"))
    (tmp_path / "default_cache").mkdir(exist_ok=True)
    lm_callback, global_callback = SpyCallback(), SpyCallback()
    engine = KeywordEngine()
    lm = dspy.LM("keyword/fake", engine=engine, callbacks=[lm_callback])
    cache = SpyCache(tmp_path / "cache")
    # In the module's namespace, not through setattr: reading dspy.cache first would build DSPy's
    # default cache; undo puts back what was there, or nothing (DSPy then builds it lazily).
    monkeypatch.setitem(vars(dspy), "cache", cache)
    before = {key: dspy.settings.get(key) for key in ("lm", "callbacks", "track_usage")}
    dspy.configure(lm=lm, callbacks=[global_callback])
    out, err = io.StringIO(), io.StringIO()
    try:
        with (
            captured_logs() as logs,
            dspy.track_usage() as usage,
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            yield Spies(
                engine,
                lm,
                global_callback,
                lm_callback,
                cache,
                tmp_path / "cache",
                tmp_path / "default_cache",
                logs,
                usage,
                out,
                err,
                len(GLOBAL_HISTORY),
                len(dspy.settings.trace or []),
            )
    finally:
        dspy.configure(**before)


# The private set of the side-channel tests: every record has a unique tag; one is garbled (the
# model's reply does not parse: DSPy logs the error with the record), one has no keyword (the
# model parrots its first word: the output, hence the cached response, holds private text) and
# one is not a string (DSPy's type-mismatch warning quotes the value).
SIDE_PRIVATE = private_records(9) + [
    example(f"{GARBLE_MARKER} my plan zqprivgarbled", "bill"),
    example("zqprivparrot says hello", "tech"),
    example({"text": "my card was stolen zqprivtyped"}, "fraud"),
]
SIDE_NEEDLES = [f"{PRIVATE_TAG}{i}" for i in range(9)] + [
    "zqprivgarbled",
    "zqprivparrot",
    "zqprivtyped",
    f"a {PRIVATE_TAG} call",
]


def test_stock_evaluate_shows_every_side_channel_can_see_private_records(tmp_path, monkeypatch) -> None:
    # The control: DSPy's own Evaluate on the private records, with nothing keeping them out.
    with spies(tmp_path, monkeypatch) as watch:
        program = classifier(TYPED)
        watch.programs.append(program)
        dspy.Evaluate(devset=SIDE_PRIVATE, metric=label_metric, num_threads=1, display_progress=False)(program)
    seen = watch.seen(SIDE_NEEDLES)
    expected = {
        "global callback",
        "LM callback",
        "global history",
        "LM history",
        "program history",
        "trace",
        "cache requests",
        "memory cache",
        "disk cache",
        "usage tracker",
        "logs",
    }
    assert expected <= set(seen), f"a spy saw nothing: {sorted(expected - set(seen))}; seen: {sorted(seen)}"
    assert {"zqprivgarbled", "zqprivtyped"} <= set(seen["logs"])  # the parse error and the type warning


def test_a_stock_optimizer_hands_the_trainset_to_global_callbacks(tmp_path, monkeypatch) -> None:
    # The control for compile callbacks: DSPy calls on_compile_start with the compile's inputs.
    with spies(tmp_path, monkeypatch) as watch:
        dspy.LabeledFewShot(k=4).compile(classifier(TYPED), trainset=SIDE_PRIVATE)
    compile_events = [line for line in watch.global_callback.seen if line.startswith("compile_start")]
    assert compile_events and found_in(compile_events[0], SIDE_NEEDLES)


PUBLIC_PROBE = "zqpublicprobe hello there"  # no keyword: the model parrots "zqpublicprobe"
PUBLIC_NEEDLES = ["zqpublicprobe", "a call counted"]


@pytest.mark.parametrize("threads", [1, 2])
def test_dpes_keeps_private_records_out_of_every_dspy_side_channel(threads, tmp_path, monkeypatch) -> None:
    from dp_textgrad.integrations.dspy import DPES

    with spies(tmp_path, monkeypatch) as watch:
        student = classifier(TYPED)
        watch.programs.append(student)
        # The LM is DSPy's configured one (spied); it is also asked for instruction rewrites.
        optimizer = DPES(
            label_metric,
            auto=None,
            generations=2,
            population=3,
            parents=2,
            public_trainset=public_records(),
            instruction_following=True,
            num_threads=threads,
            runs_root=tmp_path / "runs",
            insecure_noise_seed=1,
        )
        compiled = optimizer.compile(student, trainset=SIDE_PRIVATE)
        watch.programs.append(compiled)
        private_calls = watch.engine.private_calls
        during_compile = watch.seen(SIDE_NEEDLES)
        compiled(sentence=PUBLIC_PROBE)  # the spies are live: a public call reaches each of them
    assert private_calls >= len(SIDE_PRIVATE), "the private records were not run through the program"
    assert not during_compile, f"private records reached DSPy's side channels: {during_compile}"
    assert not watch.seen(SIDE_NEEDLES), "private records reached a side channel after the compile"
    expected = {
        "global callback",
        "LM callback",
        "global history",
        "LM history",
        "program history",
        "trace",
        "cache requests",
        "memory cache",
        "disk cache",
        "usage tracker",
    }
    public_seen = watch.seen(PUBLIC_NEEDLES)
    assert expected <= set(public_seen), f"a spy was not live: {sorted(expected - set(public_seen))}"
    private_text = [needle for needle in SIDE_NEEDLES if needle.startswith(PRIVATE_TAG)]
    assert not files_holding(tmp_path, private_text)  # the runs root, DSPy's caches


# -- the canary -------------------------------------------------------------------------------------
CANARY = "canary-7f3a9 Zorblax Quentworth"
CANARY_NEEDLES = (CANARY, "canary-7f3a9", "Zorblax", "Quentworth")  # nor any piece of it


def canary_trainset() -> list[Any]:
    """Eleven private records and, first, the canary (labelled as the model labels it, so that
    BootstrapFewShot's metric accepts its trace too)."""
    return [example(f"{CANARY} was charged twice for my plan", "bill")] + private_records(11)


def saved_json(program: Any, path: Path) -> str:
    program.save(str(path))
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize("stock", ["LabeledFewShot", "BootstrapFewShot"])
def test_a_stock_optimizer_copies_the_canary_into_the_compiled_program(stock, tmp_path) -> None:
    if stock == "LabeledFewShot":
        optimizer = dspy.LabeledFewShot(k=16)
    else:
        optimizer = dspy.BootstrapFewShot(metric=label_metric, max_bootstrapped_demos=4, max_labeled_demos=16)
    with dspy.context(lm=keyword_lm(cache=False)):
        compiled = optimizer.compile(classifier(), trainset=canary_trainset())
    saved = saved_json(compiled, tmp_path / "program.json")
    assert CANARY in saved  # verbatim, in the demos of the program a user would ship
    demos = json.loads(saved)["demos"]
    assert any(CANARY in demo["sentence"] for demo in demos)


# -- the twin run on the DSPy path --------------------------------------------------------------------
RARE_WORDS = "zqxj vuwk ptfh grml dbzv kxqw jhyf".split()


def twin_long_record() -> Any:
    """300 words of rare tokens with :data:`SLOW_MARKER`: the model takes long on it, reports many
    tokens and labels it ``"none"``, while its label is ``"tech"``: every candidate scores it 0,
    so it is invisible to every DP sum and only a leak can tell the runs apart."""
    words = [SLOW_MARKER] + [f"{RARE_WORDS[i % len(RARE_WORDS)]}{i}" for i in range(299)]
    return example(" ".join(words), "tech")


_TWIN = dict(epsilon=4.0, auto=None, generations=3, population=3, parents=2, sampling_rate=0.5, insecure_noise_seed=5)
TWIN_SCHEDULES = {
    # rule edits and public demonstrations only (the default for an LM not said to follow instructions)
    "rule edits": {**_TWIN, "feedback": "none"},
    # LLM rewrites through the user's LM, fed by the DP failure histogram (coupled as in its proof)
    "LLM rewrites, failure histogram": {**_TWIN, "feedback": "dp_confusion", "instruction_following": True},
}


def couple_scored_failure_histogram(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Gaussian's coupling for the failure histogram of a scored task (tests only; the same
    as ``tests.twin.couple_failure_histogram`` for generation tasks): in the D+x run the long
    record adds one unit to its category of each released histogram when it is sampled; the proof
    pairs the D run's noise e with e minus that unit, so its totals are taken without the unit
    (after the one-unit-per-record check). Its scores need no coupling: they are 0."""
    from dp_textgrad.dp_es import scoring_backends
    from dp_textgrad.tasks.scored import ScoredTask

    units: dict[str, list[float]] = {}
    outcomes, totals = ScoredTask.private_outcomes, scoring_backends.batch_totals

    def marked(self, engine, prompt, batch):
        found = outcomes(self, engine, prompt, batch)
        unit = [0.0] * len(self.categories)
        for record, category in zip(batch, found.categories):
            if SLOW_MARKER in record.unwrap().sentence:
                unit[int(category)] += 1.0
        units[prompt] = unit
        return found

    def coupled(task, engine, prompts, batch, clip_bound, with_confusion):
        units.clear()
        found = totals(task, engine, prompts, batch, clip_bound, with_confusion)
        if found.confusion is None:
            return found
        shift = np.array([units[str(p)] for p in prompts])
        return scoring_backends.SubsampleTotals(found.sums, found.confusion - shift)

    monkeypatch.setattr(ScoredTask, "private_outcomes", marked)
    monkeypatch.setattr(scoring_backends, "batch_totals", coupled)


@dataclass
class DSPyTwin:
    """One DPES compile of a twin pair: its released channels (a ``tests.twin.Capture``) and how
    many times the model was run on the long record."""

    capture: Any
    slow_calls: int
    batched_calls: int = 0  # engine calls that generated one record under several candidates


def batched_keyword_engine() -> Any:
    """:class:`KeywordEngine`'s answers as a dp-textgrad engine that decodes several candidates
    together (``batches_prefixes``, as llama.cpp's does), for ``EngineLM`` and ``CompletionAdapter``:
    DPES then scores one record under every candidate at once (the batched path of issue 49)."""
    from dp_textgrad.engines.scripted import ScriptedEngine

    class BatchedKeywordEngine(ScriptedEngine):
        batches_prefixes = True
        instruction_following = False

        def __init__(self) -> None:
            super().__init__(responses=lambda prompt, system: self.answer(prompt))
            self.slow_calls = 0
            self.batched_calls = 0
            self.counter = threading.Lock()

        def answer(self, prompt: str) -> str:
            lines = re.findall(r"^sentence: (.*)$", prompt, flags=re.M)
            if not lines:
                return INSTRUCTION_REPLY
            sentence = lines[-1]
            if SLOW_MARKER in sentence:
                with self.counter:
                    self.slow_calls += 1
                time.sleep(KeywordEngine.seconds_per_word * len(sentence.split()))
                return "none"
            hits = [label for word, label in KEYWORDS.items() if word in sentence]
            return hits[0] if hits else (sentence.split() or ["none"])[0]

        def generate_for_prefixes(self, prefixes, suffix, **kwargs):  # type: ignore[no-untyped-def]
            with self.counter:
                self.batched_calls += 1
            return super().generate_for_prefixes(prefixes, suffix, **kwargs)

    return BatchedKeywordEngine()


class TwoPredictors(dspy.Module):
    """A draft label, then a final one from the sentence and the draft: both predictors optimized."""

    def __init__(self) -> None:
        super().__init__()
        self.draft = dspy.Predict("sentence -> label")
        self.final = dspy.Predict("sentence -> label")

    def forward(self, sentence: str) -> Any:
        draft = self.draft(sentence=sentence)
        return self.final(sentence=f"{sentence} {draft.label}")


class HelpCentreRAG(dspy.Module):
    """Retrieval over the shipped public help-centre corpus (an in-memory embedder), then a label:
    each private sentence is a retrieval query."""

    def __init__(self) -> None:
        super().__init__()
        from tests.integrations.test_dspy_retrieval import help_centre_retriever

        self.retrieve = help_centre_retriever()
        self.classify = dspy.Predict("sentence -> label")

    def forward(self, sentence: str) -> Any:
        passages = self.retrieve(sentence).passages
        assert passages  # the search ran
        return self.classify(sentence=sentence)


#: The programs the twin runs: the classifier of the side-channel tests, and the shapes issue 49
#: adds (every predictor of a program at once; retrieval declared public).
TWIN_PROGRAMS: dict[str, tuple[Any, dict[str, Any]]] = {
    "classifier": (classifier, {}),
    "two predictors": (TwoPredictors, {}),
    "retrieval": (HelpCentreRAG, {"public_retrievers": ["retrieve"]}),
}


def run_dspy_twin(
    root: Path,
    trainset: Sequence[Any],
    schedule: str,
    *,
    coupled_extra_records: int = 0,
    leak: Any = None,
    program: str = "classifier",
    batched: bool = False,
) -> DSPyTwin:
    """``DPES.compile`` of the classifier on ``trainset`` into ``root/runs``. Released channels: every
    file of the runs root outside ``operator/`` (tests.twin.collect), stdout, stderr, the exit code,
    the observers' events, the logs, DSPy's global history of the compile (its public calls), the
    compiled program's saved JSON and its guarantee. ``coupled_extra_records``: this run is the twin
    with the long record (size count, and failure histogram when released, coupled)."""
    from dspy.clients.base_lm import GLOBAL_HISTORY

    from dp_textgrad.integrations.dspy import DPES

    settings = dict(TWIN_SCHEDULES[schedule])
    make_program, program_settings = TWIN_PROGRAMS[program]
    settings.update(program_settings)
    if batched:  # a completion engine that batches candidates, through EngineLM and CompletionAdapter
        from dp_textgrad.integrations.dspy import CompletionAdapter, EngineLM

        engine: Any = batched_keyword_engine()
        lm = EngineLM(engine, max_tokens=8)
        settings["adapter"] = CompletionAdapter()
    else:
        engine = KeywordEngine()
        lm = dspy.LM("keyword/fake", engine=engine, cache=False)
    recorder = EventRecorder()
    out, err = io.StringIO(), io.StringIO()
    history_start = len(GLOBAL_HISTORY)
    saved = b""
    guarantee = b""
    with (
        pytest.MonkeyPatch.context() as patch,
        captured_logs() as logs,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        if leak is not None:
            leak(patch)
        if coupled_extra_records:
            couple_size_count(patch, coupled_extra_records)
            if settings["feedback"] != "none":
                couple_scored_failure_histogram(patch)
        try:
            optimizer = DPES(
                label_metric,
                public_trainset=public_records(),
                lm=lm,
                runs_root=root / "runs",
                observers=[recorder],
                **settings,
            )
            compiled = optimizer.compile(make_program(), trainset=list(trainset))
            saved = saved_json(compiled, root / "program.json").encode()
            guarantee = repr(compiled.dp_guarantee).encode()
            exit_code = 0
        except Exception as exc:  # noqa: BLE001 - the failure is itself a released channel
            err.write(f"{type(exc).__name__}: {exc}\n")
            exit_code = 1
    run_dirs = [p for p in (root / "runs").iterdir() if p.is_dir() and p.name != "operator"]
    assert len(run_dirs) == 1, (err.getvalue(), run_dirs)

    class _Result:  # what collect() reads from a CLI result
        pass

    result = _Result()
    result.exit_code, result.stdout, result.stderr = exit_code, out.getvalue(), err.getvalue()
    capture = collect(root, run_dirs[0], result)
    capture.released["<callbacks>"] = "\n".join(recorder.lines).encode()
    capture.released["<logs>"] = "\n".join(logs.lines).encode()
    capture.released["<dspy history>"] = "\n".join(
        repr({k: entry.get(k) for k in ("prompt", "messages", "outputs", "kwargs")})
        for entry in GLOBAL_HISTORY[history_start:]
    ).encode()
    capture.released["<program.json>"] = saved
    capture.released["<dp_guarantee>"] = guarantee
    return DSPyTwin(capture, engine.slow_calls, getattr(engine, "batched_calls", 0))


def dspy_twin_pair(
    root: Path, schedule: str, leak: Any = None, program: str = "classifier", batched: bool = False
) -> tuple[DSPyTwin, DSPyTwin]:
    records = private_records(24)
    d = run_dspy_twin(root / "d", records, schedule, leak=leak, program=program, batched=batched)
    dx = run_dspy_twin(
        root / "dx",
        records + [twin_long_record()],
        schedule,
        coupled_extra_records=1,
        leak=leak,
        program=program,
        batched=batched,
    )
    return d, dx


@pytest.fixture(scope="module", params=sorted(TWIN_SCHEDULES))
def dspy_twins(request, tmp_path_factory):
    return request.param, dspy_twin_pair(tmp_path_factory.mktemp("dspy_twin"), request.param)


def test_the_dspy_twin_runs_finish_and_score_the_long_record(dspy_twins) -> None:
    schedule, (d, dx) = dspy_twins
    for run in (d, dx):
        assert run.capture.exit_code == 0, run.capture.stderr
        assert b'"instructions"' in run.capture.released["<program.json>"]
    # Power: the long record was sampled and run through the program (slowly, with many tokens).
    assert d.slow_calls == 0 and dx.slow_calls > 0
    charges = [json.loads(line)["metadata"] for line in d.capture.released["ledger.jsonl"].splitlines()[1:]]
    with_histogram = [c for c in charges if c.get("feedback_candidates")]
    assert bool(with_histogram) == (schedule == "LLM rewrites, failure histogram")


def test_every_released_channel_of_the_dspy_twin_is_identical(dspy_twins) -> None:
    _, (d, dx) = dspy_twins
    diff = differences(d.capture, dx.capture)
    details = {
        name: json_differences(d.capture, dx.capture, name) for name in diff if name.endswith((".json", ".jsonl"))
    }
    assert not diff, f"released channels differ between D and D+x: {diff}; fields: {json.dumps(details)}"


@pytest.mark.parametrize("program", ["two predictors", "retrieval"])
def test_the_twin_of_a_multi_predictor_and_a_retrieval_program_differs_in_no_released_channel(
    program, tmp_path
) -> None:
    d, dx = dspy_twin_pair(tmp_path, "LLM rewrites, failure histogram", program=program)
    for run in (d, dx):
        assert run.capture.exit_code == 0, run.capture.stderr
    assert d.slow_calls == 0 and dx.slow_calls > 0  # power: the long record ran through the program
    diff = differences(d.capture, dx.capture)
    assert not diff, f"released channels differ between D and D+x: {diff}"


def _count_batched_records(patch: pytest.MonkeyPatch) -> list[int]:
    """Count the private records DPES scores on the batched path (one record under every candidate)."""
    from dp_textgrad.tasks.scored import ScoredTask

    scored = [0]
    many = ScoredTask._outcomes_many

    def counting(self, prompts, records):  # type: ignore[no-untyped-def]
        scored[0] += len(records)
        return many(self, prompts, records)

    patch.setattr(ScoredTask, "_outcomes_many", counting)
    return scored


@pytest.mark.parametrize("program", ["classifier", "two predictors"])
def test_the_twin_on_the_batched_path_differs_in_no_released_channel_and_a_planted_leak_shows(
    program, tmp_path
) -> None:
    """One record under every candidate at once (EngineLM on an engine that batches candidates):
    the twin's released channels are identical; counting the records scored on that path into the
    reports makes them differ (the test's power on this path)."""
    d, dx = dspy_twin_pair(tmp_path / "clean", "rule edits", program=program, batched=True)
    for run in (d, dx):
        assert run.capture.exit_code == 0, run.capture.stderr
        assert run.batched_calls > 0  # the batched path ran
    assert d.slow_calls == 0 and dx.slow_calls > 0  # power: the long record ran through the program
    diff = differences(d.capture, dx.capture)
    assert not diff, f"released channels differ between D and D+x: {diff}"
    leaky_d, leaky_dx = dspy_twin_pair(
        tmp_path / "leak", "rule edits", program=program, batched=True,
        leak=lambda patch: _leak_count_into_reports(patch, _count_batched_records),
    )
    assert leaky_dx.slow_calls > 0 and differences(leaky_d.capture, leaky_dx.capture)


def _count_private_records(patch: pytest.MonkeyPatch) -> list[int]:
    """Count the private records DPES scores (a value computed from the secret subsample)."""
    from dp_textgrad.tasks.scored import ScoredTask

    scored = [0]
    outcomes = ScoredTask.private_outcomes

    def counting(self, engine, prompt, batch):
        scored[0] += len(batch)
        return outcomes(self, engine, prompt, batch)

    patch.setattr(ScoredTask, "private_outcomes", counting)
    return scored


def _leak_count_into_reports(patch: pytest.MonkeyPatch, count: Any = None) -> None:
    """The number of private records scored so far (``count``: how they are counted, default
    :func:`_count_private_records`), put into each generation's report as its public usage
    (metrics.jsonl and the observers' events)."""
    import dataclasses

    from dp_textgrad.dp_es.optimizer import DPEvolutionStrategy

    scored = (count or _count_private_records)(patch)
    report = DPEvolutionStrategy._report
    patch.setattr(
        DPEvolutionStrategy,
        "_report",
        lambda self, t, best, public, *rest: dataclasses.replace(
            report(self, t, best, public, *rest), public_completion_tokens=scored[0]
        ),
    )


def _leak_count_into_the_program(patch: pytest.MonkeyPatch) -> None:
    """The number of private records scored, saved with the compiled program's guarantee."""
    from dp_textgrad.integrations.dspy.guarantee import DPGuarantee

    scored = _count_private_records(patch)
    as_dict = DPGuarantee.as_dict
    patch.setattr(DPGuarantee, "as_dict", lambda self: {**as_dict(self), "records_scored": scored[0]})


DSPY_LEAKS = {
    "count into the reports": (_leak_count_into_reports, {"metrics.jsonl", "<callbacks>"}),
    "count into the program": (_leak_count_into_the_program, {"<program.json>"}),
}


@pytest.mark.parametrize("leak", sorted(DSPY_LEAKS))
def test_the_dspy_twin_check_fails_on_a_planted_leak(leak, tmp_path) -> None:
    plant, channels = DSPY_LEAKS[leak]
    d, dx = dspy_twin_pair(tmp_path, "rule edits", leak=plant)
    assert d.capture.exit_code == 0 and dx.capture.exit_code == 0, d.capture.stderr + dx.capture.stderr
    diff = set(differences(d.capture, dx.capture))
    assert channels <= diff, f"the planted leak ({leak}) went unseen: {sorted(diff)}"


@pytest.mark.parametrize("program", sorted(TWIN_PROGRAMS))
def test_dpes_never_releases_the_canary(program, tmp_path) -> None:
    from dspy.clients.base_lm import GLOBAL_HISTORY

    from dp_textgrad.integrations.dspy import DPES
    from dp_textgrad.integrations.dspy.retrieval import cached_private_queries

    make_program, program_settings = TWIN_PROGRAMS[program]
    student = make_program()

    recorder = EventRecorder()
    out, err = io.StringIO(), io.StringIO()
    history_start = len(GLOBAL_HISTORY)
    engine = KeywordEngine()
    with captured_logs() as logs, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        optimizer = DPES(
            label_metric,
            auto=None,
            generations=2,
            population=3,
            parents=2,
            public_trainset=public_records(),
            lm=dspy.LM("keyword/fake", engine=engine, cache=False),
            instruction_following=True,
            runs_root=tmp_path / "runs",
            observers=[recorder],
            **program_settings,
        )
        compiled = optimizer.compile(student, trainset=canary_trainset())
    saved = saved_json(compiled, tmp_path / "program.json")
    assert engine.private_calls > 0  # the canary's trainset was run through the program
    state = json.loads(saved)  # a Predict's own state, or a program's by predictor name
    states = [state] if "dp_guarantee" in state else [v for v in state.values() if isinstance(v, dict)]
    guarantees = [value["dp_guarantee"] for value in states if "dp_guarantee" in value]
    assert guarantees and all(g["differentially_private"] is True for g in guarantees)
    # No cache of a retriever or embedder (DSPy's, memory and disk; litellm's; a search queue) holds
    # a private query, in the user's program or the compiled one.
    queries = [record.sentence for record in canary_trainset()]
    assert cached_private_queries(student, queries) == [] and cached_private_queries(compiled, queries) == []
    # The saved program, every file of the run directory and the runs root (operator/ included).
    assert not files_holding(tmp_path, CANARY_NEEDLES)
    assert (tmp_path / "runs").is_dir() and (tmp_path / "program.json").is_file()
    released = {
        "console": out.getvalue() + err.getvalue(),
        "logs": "\n".join(logs.lines),
        "observers": "\n".join(recorder.lines),
        "program": repr(compiled) + repr(compiled.dp_guarantee) + repr(compiled.named_predictors()),
        "outcome": repr(optimizer.outcome.result),
        "dspy history": repr(
            [entry.get("prompt") or entry.get("messages") for entry in GLOBAL_HISTORY[history_start:]]
        ),
    }
    leaked = {name: hits for name, text in released.items() if (hits := found_in(text, CANARY_NEEDLES))}
    assert not leaked, f"the canary left DPES: {leaked}"
    assert recorder.lines
    demos = [demo for _, predictor in compiled.named_predictors() for demo in predictor.demos]
    assert all(any(dict(demo) == dict(public) for public in public_records()) for demo in demos)


def test_the_canary_check_finds_the_canary_when_it_is_given_as_public_data(tmp_path) -> None:
    # Power: the canary record passed as a PUBLIC example may become a demonstration in the
    # instruction (the demo operators write public examples into it), and the check sees it there.
    from dp_textgrad.integrations.dspy import DPES

    optimizer = DPES(
        label_metric,
        auto=None,
        generations=2,
        population=3,
        parents=2,
        insecure_noise_seed=1,
        public_trainset=canary_trainset()[:4],
        lm=keyword_lm(cache=False),
        instruction_following=True,
        runs_root=tmp_path / "runs",
    )
    compiled = optimizer.compile(classifier(), trainset=private_records(12))
    saved_json(compiled, tmp_path / "program.json")
    assert "checkpoint.json" in " ".join(files_holding(tmp_path, [CANARY]))
