"""The twin-run harness of the release-boundary tests.

Two runs of ``dp-textgrad optimize`` that differ in one private record: D, and D plus
``x``, a record ten times longer than the median and full of rare tokens. The engine is
scripted, but its token usage and its latency grow with the length of what it scores, as
a real engine's do. Everything the runs release is collected, normalised (run-directory
name, temporary paths) and compared; the operator-only area is collected apart.

Record ``x`` is built so that every DP statistic of the two runs is identical when the
noise is seeded: no candidate predicts its label (its clipped score is 0), and the
Poisson subsample draws one extra uniform for it after those of D. So any difference in
a released channel is a leak, not noise.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dp_textgrad import cli
from dp_textgrad.engines.scripted import ScriptedEngine, scripted_tokens
from dp_textgrad.settings import EngineSection

LABELS = ("bill", "tech", "fraud")
CUES = {"bill": "I was charged twice for my plan", "tech": "the app crashes when I open it",
        "fraud": "someone used my stolen card"}
RARE = "zqxj vuwk ptfh grml dbzv kxqw jhyf "
CHILDREN = ["Name the request of the message: bill, tech or fraud.",
            "Read the message and give its label (bill, tech, fraud)."]


class LengthTimedEngine(ScriptedEngine):
    """Scores from the record's cue only; usage and latency grow with the record's length."""

    seconds_per_token = 0.0004

    def __init__(self) -> None:
        super().__init__(responses=list(CHILDREN))

    def score_choices_batch(self, prefix: str, suffixes: Sequence[str], choices: Sequence[str]) -> np.ndarray:
        tokens = len(scripted_tokens(prefix)) + sum(len(scripted_tokens(s)) for s in suffixes)
        time.sleep(self.seconds_per_token * tokens)
        rows = []
        for suffix in suffixes:
            hit = [label for label in LABELS if CUES[label] in suffix]
            target = hit[0] if hit else LABELS[0]
            rows.append([0.0 if c.strip() == target else -4.0 for c in choices])
        self._count(prompt_tokens=tokens, seconds=self.seconds_per_token * tokens)
        return np.array(rows, dtype=float).reshape(len(suffixes), len(choices))


def write_rows(path: Path, rows: Sequence[tuple[str, str]]) -> None:
    lines = ["text,label"] + [f"{text},{label}" for text, label in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def base_rows(n: int) -> list[tuple[str, str]]:
    return [(f"{CUES[LABELS[i % 3]]} {i}", LABELS[i % 3]) for i in range(n)]


def long_record(rows: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """Ten times the median length, rare tokens only, labelled so that no candidate gets it right."""
    median = float(np.median([len(scripted_tokens(text)) for text, _ in rows]))
    words = RARE.split()
    text = " ".join(words[i % len(words)] + str(i) for i in range(int(10 * median)))
    return text, LABELS[1]


@dataclass
class Capture:
    """Everything one CLI run produced, split into released channels and operator-only files."""

    root: Path
    run_dir: Path
    exit_code: int
    stdout: str
    stderr: str
    released: dict[str, bytes] = field(default_factory=dict)
    operator: dict[str, bytes] = field(default_factory=dict)

    def normalised(self, name: str) -> bytes:
        """The channel's bytes with what differs between any two runs replaced: the run-directory
        name, the temporary root, and the run log's ``started`` (wall clock at the start, before
        any private record is read)."""
        data = self.released[name]
        for path, placeholder in ((str(self.root), "<ROOT>"), (self.run_dir.name, "<RUN>")):
            data = data.replace(path.encode(), placeholder.encode())
        return re.sub(rb'"started": "[^"]*"', b'"started": "<TIME>"', data)


def collect(root: Path, run_dir: Path, result) -> Capture:
    """The run's channels; :data:`MTIMES` is one more: the modification time of every released file
    and folder (the runs root, the run directory, plots/, the run log; operator/ left out)."""
    capture = Capture(root, run_dir, result.exit_code, result.stdout, result.stderr)
    capture.released["<stdout>"] = result.stdout.encode()
    capture.released["<stderr>"] = result.stderr.encode()
    capture.released["<exit code>"] = str(result.exit_code).encode()
    times: dict[str, int] = {}
    runs_root = root / "runs"
    for path in [runs_root, *sorted(runs_root.rglob("*"))]:
        # Files beside the run directories (run log, operator/ store) by their place in the runs root.
        relative = path.relative_to(run_dir if run_dir in path.parents else runs_root).as_posix()
        operator = relative == "operator" or relative.startswith("operator/")
        if not operator:
            times[relative] = path.stat().st_mtime_ns
        if path.is_file():
            bucket = capture.operator if operator else capture.released
            bucket[relative] = path.read_bytes()
    capture.released[MTIMES] = json.dumps(times, indent=1, sort_keys=True).encode()
    return capture


# A released channel: a file's time may time the private phase (and survives tar, zip and copies).
# JSON, so that a failing twin test names the paths whose times differ.
MTIMES = "<mtimes>.json"


SCRIPTED_ENGINE = '[engine]\nkind = "openai"\nmodel = "twin"\nbase_url = "http://127.0.0.1:9/v1"\n'
TASK_LINES = ('description = "Customer messages about a bill, a technical problem or fraud."\n'
              'seed_prompt = "Label the message."\n')


def couple_size_count(monkeypatch, extra_records: int) -> None:
    """The coupling of the DP proof for the size count, made explicit (tests only).

    When N is not declared, a run releases N plus discrete Laplace noise. D and D+x differ
    by one record, so under the same seeded noise their noisy counts differ by one. The
    proof of the count's privacy pairs each noise value e of the D run with e - 1 for the
    D+x run (both have probability within a factor exp(eps) of each other), and under that
    pairing both release the same count. Here the D+x run's noise is ``extra_records``
    smaller, i.e. its count is released as if it were ``extra_records`` smaller; the count
    draws as much randomness either way, so every later noise draw stays the same. Then
    every released byte must be identical.
    """
    from dp_textgrad.privacy import mechanisms

    release = mechanisms.LaplaceCountMechanism.release
    monkeypatch.setattr(mechanisms.LaplaceCountMechanism, "release",
                        lambda self, count, noise: release(self, count - extra_records, noise))


def run_twin(root: Path, rows: Sequence[tuple[str, str]], monkeypatch, config_lines: str,
             engine_factory: Callable[[], ScriptedEngine] | None = LengthTimedEngine,
             extra_args: Sequence[str] = (), engine_lines: str = SCRIPTED_ENGINE,
             test_rows: Sequence[tuple[str, str]] | None = None, task_lines: str = TASK_LINES,
             coupled_extra_records: int = 0) -> Capture:
    """One ``optimize`` run on ``rows``; ``engine_factory=None`` builds the engine the config names.

    ``coupled_extra_records``: this run is the twin with that many more records than the other
    one; its size count is coupled to the other's (:func:`couple_size_count`).
    """
    (root / "data").mkdir(parents=True)
    write_rows(root / "data" / "train.csv", rows)
    write_rows(root / "data" / "test.csv", base_rows(9) if test_rows is None else test_rows)
    config = root / "run.toml"
    config.write_text(
        '[task]\ntrain = "data/train.csv"\ntest = "data/test.csv"\n' + task_lines + engine_lines +
        f"[dp]\n{config_lines}\n"
        f'[output]\nruns_root = "{(root / "runs").as_posix()}"\n', encoding="utf-8")
    if engine_factory is not None:
        monkeypatch.setattr(EngineSection, "build", lambda section: engine_factory())
    with pytest.MonkeyPatch.context() as coupling:  # for this run only
        if coupled_extra_records:
            couple_size_count(coupling, coupled_extra_records)
        result = CliRunner().invoke(cli.app, ["optimize", "--config", str(config), *extra_args])
    run_dirs = [p for p in (root / "runs").glob("run-*") if p.is_dir()]
    assert len(run_dirs) == 1, (result.output, run_dirs)
    return collect(root, run_dirs[0], result)


def differences(a: Capture, b: Capture) -> list[str]:
    """Names of released channels whose normalised bytes differ (or exist in one run only)."""
    names = sorted(set(a.released) | set(b.released))
    out = []
    for name in names:
        if name not in a.released or name not in b.released:
            out.append(f"{name} (only in one run)")
        elif a.normalised(name) != b.normalised(name):
            out.append(name)
    return out


def json_differences(a: Capture, b: Capture, name: str) -> list[str]:
    """Dotted paths of the values that differ in a JSON or JSON-lines channel (for messages)."""
    def load(capture: Capture) -> object:
        text = capture.normalised(name).decode()
        if name.endswith(".jsonl"):
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        return json.loads(text)

    found: list[str] = []

    def walk(x: object, y: object, where: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            for key in sorted(set(x) | set(y)):
                walk(x.get(key), y.get(key), f"{where}.{key}" if where else str(key))
        elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            for i, (u, v) in enumerate(zip(x, y)):
                walk(u, v, f"{where}[{i}]")
        elif x != y:
            found.append(where)

    walk(load(a), load(b), "")
    return found


# Released JSON files and the release-table channel of their payloads (one per line for JSONL).
JSON_CHANNELS = {"metrics.jsonl": "metrics", "result.json": "result", "checkpoint.json": "checkpoint",
                 "config.json": "config", "run_metadata.jsonl": "run_log"}
_FLOAT = re.compile(rb"-?\d+\.\d+")


def _mask(channel: str, payload: object) -> object:
    from dp_textgrad.privacy import release

    if not isinstance(payload, dict):
        return payload
    out = {}
    for name, value in payload.items():
        kind = release.classify(channel, name)
        if kind == release.DP_OUTPUT:
            out[name] = "<DP>"
        elif kind.startswith(release.NESTED):
            out[name] = [_mask(kind[len(release.NESTED):], item) for item in value or []]
        else:
            out[name] = value
    return out


def masked(capture: Capture, name: str) -> object:
    """A released channel with its DP-output fields masked (JSON), or its decimals masked (stdout).

    For a twin pair whose DP outputs may differ (a real model): everything else must agree.
    Reports and plots are rendered from the released JSON alone, so they are not compared.
    """
    data = capture.normalised(name)
    if name in JSON_CHANNELS:
        channel = JSON_CHANNELS[name]
        if name.endswith(".jsonl"):
            return [_mask(channel, json.loads(line)) for line in data.decode().splitlines() if line.strip()]
        return _mask(channel, json.loads(data))
    if name == "<stdout>":
        return _FLOAT.sub(b"<x.x>", data)
    return data


def masked_differences(a: Capture, b: Capture) -> list[str]:
    skip = ("report.md", "report.html", "plots/", "released_prompt.txt")
    names = sorted(n for n in set(a.released) | set(b.released) if not n.startswith(skip))
    return [n for n in names if n not in a.released or n not in b.released or masked(a, n) != masked(b, n)]


# -- generation twins: the Python API, an engine whose output length and latency follow the record ----
GEN_CITIES = ("Paris", "Oslo", "Lima", "Rome")
GEN_MARKER = "zqxjmarker"  # the long record's tell: the engine writes 200 words for it, slowly
GEN_CHILDREN = ("Name the city the message mentions, one word.", "Give the city of the order, one word only.")
GEN_TEMPLATE = "Input: {text}\nOutput:"


def generation_records(n: int, start: int = 0) -> list:
    from dp_textgrad.tasks.generation import GenerationExample

    return [GenerationExample(f"Order {i} went to a shop in {GEN_CITIES[i % 4]}", reference=GEN_CITIES[i % 4])
            for i in range(start, start + n)]


def generation_long_record(records: Sequence) -> object:
    """Ten times the median input, rare tokens and the marker; its reference is no city of the
    run's answers, so every candidate scores it 0 (an invisible record for the DP sums)."""
    from dp_textgrad.tasks.generation import GenerationExample

    median = float(np.median([len(scripted_tokens(r.text)) for r in records]))
    words = RARE.split()
    text = GEN_MARKER + " " + " ".join(words[i % len(words)] + str(i) for i in range(int(10 * median)))
    return GenerationExample(text, reference="Atlantis")


class LengthTimedGenerator(ScriptedEngine):
    """Answers the city of the input when the prompt asks for the city; for the record holding
    :data:`GEN_MARKER` it writes 200 words after a pause (output length and latency follow the
    record, as a real model's do). As a judge ("Grade: N/10" prompts) it compares the answer with
    the reference. Anything else (mutation, critiques) gets :data:`GEN_CHILDREN` in turn."""

    seconds_per_word = 0.0005

    def __init__(self) -> None:
        self._turn = 0
        super().__init__(responses=self._answer)

    def _answer(self, prompt: str, system: str | None) -> str:
        if "Answer to grade:" in prompt:  # the judge: the same engine, so its calls are private usage
            reference = prompt.split("Reference answer:\n", 1)[1].split("\n\n", 1)[0].strip()
            answer = prompt.split("Answer to grade:\n", 1)[1].split("\n\n", 1)[0].strip()
            return "Grade: 10/10" if answer == reference else "Grade: 0/10"
        if prompt.rstrip().endswith("Output:"):  # a record to answer
            record = prompt.rsplit("Input:", 1)[-1]
            if GEN_MARKER in record:
                time.sleep(200 * self.seconds_per_word)
                return " " + " ".join(f"w{i}" for i in range(200))
            match = re.search(r"in (\w+)", record)
            return " " + (match.group(1) if match and "city" in prompt.lower() else "none")
        self._turn += 1
        return GEN_CHILDREN[self._turn % len(GEN_CHILDREN)]


def couple_failure_histogram(monkeypatch) -> None:
    """The coupling of the DP proof for the failure histogram, made explicit (tests only).

    In the D+x run the long record adds one unit to its category in each released histogram
    (when it is sampled). The Gaussian's proof pairs the noise e of the D run with e minus that
    one-hot vector for the D+x run; under that pairing both runs release the same histogram.
    Here the D+x run's histogram totals are taken as if the unit were not there (after the
    one-unit-per-record check); the noise draws are unchanged. Its scores need no coupling:
    the record scores 0 for every candidate.
    """
    from dp_textgrad.dp_es import scoring_backends
    from dp_textgrad.tasks.generation import GenerationTask

    units: dict[str, np.ndarray] = {}
    outcomes, outcomes_many = GenerationTask._outcomes, GenerationTask._outcomes_many
    totals = scoring_backends.batch_totals

    def mark(self, prompt, examples, found) -> None:
        unit = np.zeros(len(self.metric.categories))
        for example, category in zip(examples, found.categories):
            if GEN_MARKER in example.text:
                unit[int(category)] += 1.0
        units[prompt] = unit

    def marked_outcomes(self, engine, prompt, examples):
        found = outcomes(self, engine, prompt, examples)
        mark(self, prompt, examples, found)
        return found

    def marked_outcomes_many(self, engine, prompts, examples):  # the scorer's path: all prompts per record
        found = outcomes_many(self, engine, prompts, examples)
        for prompt, one in zip(prompts, found):
            mark(self, prompt, examples, one)
        return found

    def coupled_totals(task, engine, prompts, batch, clip_bound, with_confusion):
        units.clear()
        found = totals(task, engine, prompts, batch, clip_bound, with_confusion)
        if found.confusion is None:
            return found
        shift = np.stack([units[str(p)] for p in prompts])
        return scoring_backends.SubsampleTotals(found.sums, found.confusion - shift)

    monkeypatch.setattr(GenerationTask, "_outcomes", marked_outcomes)
    monkeypatch.setattr(GenerationTask, "_outcomes_many", marked_outcomes_many)
    monkeypatch.setattr(scoring_backends, "batch_totals", coupled_totals)


class EventRecorder:
    """Every event a run's observers get, as text: the callback stream of a twin run."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def _add(self, kind: str, event: object) -> None:
        as_dict = getattr(event, "as_dict", None)
        body = json.dumps(as_dict(), sort_keys=True, default=str) if callable(as_dict) else repr(event)
        self.lines.append(f"{kind} {body}")

    def on_lifetime(self, event: object) -> None:
        self._add("lifetime", event)

    def on_start(self, event: object) -> None:
        self._add("start", event)

    def on_generation(self, report: object) -> None:
        self._add("generation", report)
        self.lines.append(f"generation-raw {report!r}")  # every field a user callback can read

    def on_finish(self, event: object) -> None:
        self._add("finish", event)
        self.lines.append(f"finish-result {getattr(event, 'result', None)!r}")

    def on_fail(self, event: object) -> None:
        self._add("fail", event)


def run_generation_twin(root: Path, records: Sequence, settings: dict, *, metric: str = "exact",
                        engine_factory: Callable[[], ScriptedEngine] = LengthTimedGenerator,
                        coupled_extra_records: int = 0, task_overrides: dict | None = None) -> Capture:
    """One ``dp_textgrad.optimize`` run of a generation task on ``records``; stdout, stderr and the
    observers' event stream are released channels too. ``coupled_extra_records``: this run is
    the twin with the long record (its size count and failure histogram coupled to the other's)."""
    import contextlib
    import io

    import dp_textgrad
    from dp_textgrad.privacy.data import PrivateDataset
    from dp_textgrad.tasks.generation import GenerationTask
    from dp_textgrad.tasks.metrics import JudgeMetric, metric_from_name

    engine = engine_factory()
    task = GenerationTask(
        name="cities", description="Messages about orders; the answer is the city the order went to.",
        private_train=PrivateDataset(list(records)), test=generation_records(8, 100),
        metric=JudgeMetric(engine) if metric == "judge" else metric_from_name(metric),
        **{"public_examples": generation_records(4, 200), "record_template": GEN_TEMPLATE, "max_new_tokens": 256,
           "seed_prompt": "Read the message.", **(task_overrides or {})})
    recorder = EventRecorder()
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as coupling, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if coupled_extra_records:
            couple_size_count(coupling, coupled_extra_records)
            couple_failure_histogram(coupling)
        try:
            dp_textgrad.optimize(task, engine, runs_root=root / "runs", observers=[recorder], **settings)
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
    return capture
