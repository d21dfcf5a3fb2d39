"""The configuration file of ``dp-textgrad optimize``: its schema and how it is read.

Pydantic at the edge: every unknown key, wrong type or inconsistent pair is refused
with the key's dotted path and a suggestion, before anything runs.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from dp_textgrad.dp_es.config import DPESConfig

if TYPE_CHECKING:  # the build methods import these when they run: reading settings stays cheap
    from dp_textgrad.distributed import RayScoringPool
    from dp_textgrad.engines.base import Engine
    from dp_textgrad.tasks.base import Task


class Section(BaseModel):
    """A section of a run file: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")


DEFAULT_FILE_SEED_PROMPT = "Read the text and name its label."


# Built-in tasks whose prompts generate text (the others classify): their kind is known by name.
GENERATION_TASK_NAMES = ("support_extract",)
# Fields that only one family of task reads: given with the other family they are an error.
CLASSIFY_ONLY = ("text_column", "label_column", "labels")
GENERATE_ONLY = (
    "input_column",
    "target_column",
    "metric",
    "metric_options",
    "categories",
    "max_new_tokens",
    "stop",
    "record_formats",
)
DEFAULT_GENERATION_SEED_PROMPT = "Read the input and write the answer."


class TaskSection(Section):
    """Either a built-in task (``name``) or the user's files (``train`` + ``test``).

    ``kind``: ``classify`` (the default: a label per record) or ``generate`` (a reference
    answer per record, scored by ``metric``); each family's own fields are refused with the other.
    """

    kind: Literal["classify", "generate"] = Field(
        "classify", description="classify (a label per record) or generate (a reference answer, scored by a metric)"
    )
    name: Literal["support", "sst2", "banking77", "support_extract"] | None = Field(
        None, description="built-in task; its builder's arguments go in `options`"
    )
    train: Path | None = Field(None, description="private training file (.csv, .tsv or .jsonl)")
    test: Path | None = Field(None, description="test file (evaluation only; its labels define the classes)")
    public: Path | None = Field(None, description="public examples that may be shown to the LLM")
    public_inputs: Path | None = Field(
        None,
        description="public unlabelled inputs (.txt: one per line; .jsonl/.csv/.tsv: a text column) that "
        "dp.labelling gives DP labels (classification) or DP answers (generation) to",
    )
    public_inputs_column: str | None = Field(
        None, min_length=1, description="the text column of a .jsonl/.csv/.tsv public_inputs file (default: text)"
    )
    text_column: str = "text"
    label_column: str = "label"
    encoding: str = Field("utf-8-sig", description="text encoding of the files (e.g. latin-1)")

    @field_validator("encoding")
    @classmethod
    def _known_encoding(cls, value: str) -> str:
        import codecs

        try:
            codecs.lookup(value)
        except LookupError:
            raise ValueError(f"unknown encoding {value!r}; use a Python codec name such as utf-8 or latin-1") from None
        return value

    labels: list[str] | None = Field(None, description="the classes (default: the labels of the test file)")
    description: str = Field("", description="public description of the task, shown to the mutation LLM")
    record_template: str | None = Field(None, description="how a record is shown, with {text}")
    seed_prompt: str | None = Field(
        None, description=f"the prompt evolution starts from (files: default {DEFAULT_FILE_SEED_PROMPT!r})"
    )
    # -- generation tasks (kind: generate) --------------------------------------------------
    input_column: str = Field("input", min_length=1, description="generate: the column (JSONL key) of the input")
    target_column: str = Field(
        "target", min_length=1, description="generate: the reference answer; a dotted path reads nested JSON"
    )
    metric: str = Field(
        "exact", description="generate: exact | f1 | numeric | rouge_l | json_fields | regex | judge | python:M:F"
    )
    metric_options: dict[str, Any] = Field(default_factory=dict, description="generate: the metric's options")
    categories: dict[str, str] | None = Field(
        None, description="generate: re-describe the metric's public failure categories (name -> one line)"
    )
    max_new_tokens: int = Field(64, ge=1, description="generate: public cap on the tokens of one output")
    stop: list[str] | None = Field(None, description="generate: stop strings (default: a blank line, 'Input:')")
    record_formats: list[str] | None = Field(
        None,
        description="generate: public record formats (each with {text} once) the search may try besides "
        "record_template, best with the task's own field names (default: none, the operator is off)",
    )
    options: dict[str, Any] = Field(default_factory=dict, description="more keyword arguments of the task builder")

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, value: str) -> str:
        from dp_textgrad.tasks.metrics import METRIC_NAMES

        if value == "judge" or value in METRIC_NAMES or (value.startswith("python:") and value.count(":") == 2):
            return value
        close = difflib.get_close_matches(value, [*METRIC_NAMES, "judge"], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown metric {value!r}; use one of {', '.join(METRIC_NAMES)}, judge{hint}")

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not s for s in value):
            raise ValueError("stop strings must be non-empty")
        return value

    @field_validator("record_formats")
    @classmethod
    def _record_formats(cls, value: list[str] | None) -> list[str] | None:
        from dp_textgrad.tasks.record_format import check_record_format

        return None if value is None else [check_record_format(f, f"[{i}]") for i, f in enumerate(value)]

    @field_validator(*CLASSIFY_ONLY, *GENERATE_ONLY)
    @classmethod
    def _family_field(cls, value: Any, info: ValidationInfo) -> Any:
        """A field of one family, given (not its default: a saved copy of the settings writes
        every default out) with a built-in task or a task of the other family, is refused."""
        key = str(info.field_name)
        if value == cls.model_fields[key].get_default(call_default_factory=True):
            return value
        if info.data.get("name") is not None and key in GENERATE_ONLY:  # (classify-only ones: ignored, as before)
            raise ValueError(
                "applies to your own files (task.train/task.test); a built-in task takes its builder's "
                "arguments in task.options"
            )
        kind = info.data.get("kind")
        if kind == "generate" and key in CLASSIFY_ONLY:
            fix = {"text_column": "input_column", "label_column": "target_column"}.get(key, "metric")
            raise ValueError(f"applies only to task.kind: classify, and this task is kind generate; use {fix}")
        if kind == "classify" and key in GENERATE_ONLY:
            raise ValueError(
                "applies only to task.kind: generate, and this task is kind classify (the default); "
                "set task.kind: generate, or drop it"
            )
        return value

    @model_validator(mode="after")
    def _one_source(self) -> TaskSection:
        files = {k: getattr(self, k) for k in ("train", "test", "public") if getattr(self, k) is not None}
        if self.name is not None and files:
            raise ValueError(f"give either name or train/test files, not both (got name and {', '.join(files)})")
        if self.name is None and (self.train is None or self.test is None):
            raise ValueError("give name (support, sst2, banking77, support_extract) or both train and test files")
        if self.name is not None:
            builtin = "generate" if self.name in GENERATION_TASK_NAMES else "classify"
            if "kind" in self.model_fields_set and self.kind != builtin:
                raise ValueError(
                    f"kind: the built-in task {self.name} is a {builtin} task, not {self.kind}; drop task.kind "
                    f"or set it to {builtin}"
                )
            self.kind = builtin  # type: ignore[assignment]  # the built-in task decides its family
        self._check_public_inputs()
        return self

    def _check_public_inputs(self) -> None:
        pooled = "public_inputs" in self.options
        if self.public_inputs_column is not None and self.public_inputs is None:
            raise ValueError("public_inputs_column: names a column of task.public_inputs, which is not given")
        if self.public_inputs is not None and pooled:
            raise ValueError(
                "public_inputs: give the public unlabelled inputs either as a file (task.public_inputs) or "
                "generated by the built-in task (task.options.public_inputs), not both"
            )

    def public_input_count(self) -> int:
        """How many public unlabelled inputs the task will carry, found without reading private
        records: the file's inputs (public), or the built-in builder's ``public_inputs`` option."""
        if self.public_inputs is not None:
            return len(self._load_public_inputs())
        pooled = self.options.get("public_inputs", 0)
        return pooled if isinstance(pooled, int) and not isinstance(pooled, bool) else 0

    def _load_public_inputs(self) -> list[str]:
        from dp_textgrad.dp_es.labelling import load_unlabelled

        assert self.public_inputs is not None
        try:
            return load_unlabelled(self.public_inputs, self.public_inputs_column, encoding=self.encoding)
        except (ValueError, FileNotFoundError) as exc:
            # The loader names its argument (public_inputs / column): say which run-file key.
            message = str(exc)
            for name, key in (("public_inputs:", "task.public_inputs:"), ("column:", "task.public_inputs_column:")):
                if message.startswith(name):
                    message = key + message[len(name) :]
                    break
            raise type(exc)(message) from None

    def display_name(self) -> str:
        if self.name is not None:
            return self.name
        assert self.train is not None  # the validator: a name, or train and test files
        return f"custom ({self.train.name})"

    def needs_engine(self) -> bool:
        """Whether building the task needs the run's engine (``metric: judge`` asks it to grade)."""
        return self.name is None and self.kind == "generate" and self.metric == "judge"

    def private_records(self) -> Any:
        """The task's private records (a ``PrivateDataset``), read without any engine: a judge's
        metric does not change which records a task holds (``ledger`` fingerprints them)."""
        section = self
        if self.needs_engine():
            section = self.model_copy(update={"metric": "exact", "metric_options": {}, "categories": None})
        return section.build().private_train

    def build(self, engine: Engine | None = None) -> Task:
        """The task this section names: a built-in task's builder, or the user's files read.

        ``engine``: the run's engine, which a judge metric (``metric: judge``) grades with; the
        other tasks do not need it. Every check of the files and the metric runs here, before
        anything is charged.
        """
        # The public pool is read first: a bad pool file is refused before any private file is read.
        pool = self._load_public_inputs() if self.public_inputs is not None else None
        task = self._build_task(engine)
        if pool is not None:
            import dataclasses

            # Public unlabelled inputs ride on the built task (labels or answers for dp.labelling).
            task = dataclasses.replace(task, public_inputs=pool)  # type: ignore[type-var]
        return task

    def _build_task(self, engine: Engine | None) -> Task:
        options = dict(self.options)
        try:
            if self.name is not None:
                from dp_textgrad.tasks.registry import get_task

                return get_task(self.name, **options)
            assert self.train is not None and self.test is not None  # the validator: name, or both files
            if self.kind == "generate":
                return self._build_generation(engine, options)
            from dp_textgrad.tasks.loaders import build_task_from_files

            if self.record_template is not None:
                options["record_template"] = self.record_template
            options["seed_prompt"] = self.seed_prompt or DEFAULT_FILE_SEED_PROMPT
            return build_task_from_files(
                "custom",
                self.train,
                self.test,
                public=self.public,
                labels=self.labels,
                text_column=self.text_column,
                label_column=self.label_column,
                description=self.description,
                encoding=self.encoding,
                **options,
            )
        except TypeError as exc:
            raise ValueError(f"task.options: not accepted by the task builder ({exc})") from None

    def _build_generation(self, engine: Engine | None, options: dict[str, Any]) -> Task:
        from dp_textgrad.tasks.generation_files import build_generation_task_from_files
        from dp_textgrad.tasks.metrics import Metric, judge_from_options, metric_from_name

        assert self.train is not None and self.test is not None
        metric: Metric
        if self.metric == "judge":
            if engine is None:
                raise ValueError(
                    "task.metric: judge grades with the run's engine; build the task with it "
                    "(TaskSection.build(engine)), or choose a metric that needs no model"
                )
            metric = judge_from_options(engine, self.metric_options, categories=self.categories)
        else:
            metric = metric_from_name(self.metric, self.metric_options, categories=self.categories)
        if self.record_template is not None:
            options["record_template"] = self.record_template
        if self.stop is not None:
            options["stop"] = tuple(self.stop)
        if self.record_formats is not None:
            options["record_formats"] = tuple(self.record_formats)
        options["seed_prompt"] = self.seed_prompt or DEFAULT_GENERATION_SEED_PROMPT
        return build_generation_task_from_files(
            "custom",
            self.train,
            self.test,
            metric,
            public=self.public,
            input_column=self.input_column,
            target_column=self.target_column,
            description=self.description,
            max_new_tokens=self.max_new_tokens,
            encoding=self.encoding,
            **options,
        )


class EngineSection(Section):
    kind: Literal["llama_cpp", "openai", "transformers"] = Field(
        "llama_cpp", description="llama_cpp (embedded local model), openai (any OpenAI-compatible server), transformers"
    )
    model: str | None = Field(
        None, description="GGUF path (llama_cpp), model name (openai), name or path (transformers)"
    )
    base_url: str | None = Field(None, description="openai only: e.g. http://127.0.0.1:8080/v1")
    mode: Literal["chat", "completions"] | None = Field(None, description="openai only")
    options: dict[str, Any] = Field(default_factory=dict, description="more keyword arguments of the engine")

    @model_validator(mode="after")
    def _consistent(self) -> EngineSection:
        if self.kind != "openai":
            for key in ("base_url", "mode"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key} applies only to kind: openai (kind is {self.kind})")
        if self.kind == "openai" and not self.model:
            raise ValueError("model: kind openai needs a model name (e.g. model: gpt-4o-mini)")
        if "api_key" in self.options:
            # Settings are saved in the run directory: keys belong in the environment.
            raise ValueError("options.api_key: do not put keys in configuration files; set OPENAI_API_KEY")
        return self

    def build(self) -> Engine:
        """The engine this section names (loaded: a local model is read into memory here)."""
        from dp_textgrad.engines.registry import build_engine

        return build_engine(self.kind, model=self.model, base_url=self.base_url, mode=self.mode, **self.options)

    def factory(self) -> Callable[[], Engine]:
        """Builds this section's engine where it is called: a picklable callable for the processes
        that build their own copy (Ray actors, Flower workers, silos)."""
        import functools

        return functools.partial(EngineSection.build, self)

    def follows_instructions(self) -> bool:
        """Whether the engine this section names follows rewrite instructions, decided without loading it.

        It decides ``llm_operators`` when the configuration leaves it open, and so the plan:
        ``budget`` asks here what ``optimize`` will read from the built engine. The default
        llama.cpp model (Gemma 3 270M) is a base model; a user's GGUF is taken as instruction-tuned
        unless ``engine.options.instruction_following`` says otherwise (as ``LlamaCppEngine`` does).
        The other kinds keep the engine base class's declaration, ``Engine.instruction_following``
        (True; not imported here: the engines package takes most of a second to import, and
        ``budget`` loads nothing it does not use; a test holds the two equal).
        """
        if self.kind == "llama_cpp":
            declared = self.options.get("instruction_following")
            return (self.model is not None) if declared is None else bool(declared)
        return True


class OutputSection(Section):
    runs_root: Path = Field(Path("runs"), description="where run directories are created")
    evaluate: bool = Field(True, description="report test accuracy of the seed and released prompts (not DP)")
    lifetime_store: Path | None = Field(
        None,
        description="SQLite file of the lifetime budget per dataset "
        "(default: <runs_root>/operator/lifetime_budget.sqlite)",
    )
    lifetime_cap: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="refuse a run that would push its dataset's lifetime "
        "epsilon past this (default: no cap, only shown)",
    )
    override_lifetime_cap: bool = Field(False, description="run even past the lifetime cap (the ledger says so)")
    dataset_key: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="the dataset's name in the lifetime store, shared by its versions "
        "(public; default: a fingerprint of the exact records)",
    )
    lifetime_delta: float | None = Field(
        None,
        gt=0,
        lt=1,
        allow_inf_nan=False,
        description="the dataset's lifetime delta (default: fixed by its first run)",
    )
    mlflow: str | None = Field(
        None,
        description="log the run to MLflow at this tracking URI, e.g. file:./mlruns "
        "('default': MLFLOW_TRACKING_URI or MLflow's default)",
    )
    mlflow_experiment: str = Field("dp-textgrad", min_length=1, description="MLflow experiment name")

    def lifetime(self):
        from dp_textgrad.lifetime_link import LifetimeOptions

        return LifetimeOptions(
            store=self.lifetime_store,
            cap=self.lifetime_cap,
            override_cap=self.override_lifetime_cap,
            dataset_key=self.dataset_key,
            delta=self.lifetime_delta,
        )


class DistributedSection(Section):
    enabled: bool = Field(False, description="score private records on Ray actors (needs dp-textgrad[ray])")
    actors: int = Field(2, ge=1, description="Ray actors; each holds one partition of the private records")
    address: str | None = Field(
        None, description="Ray cluster address (ray://host:10001 or auto); none: a local Ray instance on this machine"
    )
    max_restarts: int = Field(3, ge=0, description="restarts of an actor that dies (its share is rescored)")

    def build(self, engine: EngineSection) -> RayScoringPool:
        """The Ray scoring pool for ``engine``: each actor builds its own copy (``engine.build()``),
        a local model with its share of this machine's cores unless ``n_threads`` is given."""
        import os

        from dp_textgrad.distributed import RayScoringPool

        options = dict(engine.options)
        if engine.kind == "llama_cpp" and "n_threads" not in options:
            options["n_threads"] = max(1, (os.cpu_count() or 1) // self.actors)  # the cores shared out
        factory = engine.model_copy(update={"options": options}).factory()
        return RayScoringPool(factory, actors=self.actors, address=self.address, max_restarts=self.max_restarts)


class OptimizeSettings(Section):
    """The whole configuration file of ``dp-textgrad optimize``."""

    task: TaskSection = Field(default_factory=lambda: TaskSection(name="support"))
    engine: EngineSection = Field(default_factory=EngineSection)
    dp: DPESConfig = Field(default_factory=DPESConfig)
    output: OutputSection = Field(default_factory=OutputSection)
    distributed: DistributedSection = Field(default_factory=DistributedSection)

    @model_validator(mode="after")
    def _judge_fits(self) -> OptimizeSettings:
        if self.task.needs_engine():
            if self.distributed.enabled:
                # The judge holds the driver's engine; Ray actors would need a judge of their own.
                raise ValueError(
                    "task.metric: judge cannot score on Ray actors (distributed.enabled); score in this "
                    "process (distributed.enabled: false) or choose a metric that needs no model"
                )
            if not self.engine.follows_instructions():
                raise ValueError(
                    "task.metric: judge needs an instruction-following engine to grade, and the default local "
                    "model (a base model) is not one; use engine.kind openai or your own instruction-tuned "
                    "GGUF (engine.model; engine.options.instruction_following: true)"
                )
        if self.dp.labelling is not None and self.dp.labelling.synthetic_inputs is None:
            if self.task.public_inputs is None and not self.task.options.get("public_inputs"):
                raise ValueError(
                    "dp.labelling: needs public unlabelled inputs to label; give a file of them "
                    "(task.public_inputs) or, for a built-in task, task.options.public_inputs: N"
                )
        return self


def _known_keys(loc: tuple[Any, ...]) -> list[str]:
    model: Any = OptimizeSettings
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        model = field.annotation if field is not None else None
        # An optional section (``LabellingConfig | None``): its model's keys.
        model = next((m for m in getattr(model, "__args__", ()) if _is_model(m)), model)
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
    return list(model.model_fields)


def _is_model(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


def _key_line(source: Path | None, loc: tuple[Any, ...]) -> str:
    """' (FILE line N)' for the deepest key of ``loc`` found in the file, else ''."""
    if source is None or not loc:
        return ""
    import re

    try:
        lines = source.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return ""
    section, key = str(loc[0]), str(loc[-1])
    in_section = len(loc) == 1
    for number, line in enumerate(lines, start=1):
        if re.match(rf"^\s*\[\s*{re.escape(section)}\s*\]", line) or re.match(rf"^{re.escape(section)}\s*:", line):
            in_section = True
            if len(loc) == 1:
                return f" ({source.name} line {number})"
            continue
        if in_section and re.match(rf"^\s*{re.escape(key)}\s*[:=]", line):
            return f" ({source.name} line {number})"
    return f" ({source.name})"


def format_settings_error(error: ValidationError, source: Path | None = None) -> str:
    """One clause per problem, naming the key (and its line in ``source``); unknown keys get a spelling suggestion."""
    parts = []
    for item in error.errors():
        loc = tuple(item.get("loc", ()))
        where = ".".join(str(x) for x in loc) or "config"
        at = _key_line(source, loc)
        if item.get("type") == "extra_forbidden":
            known = _known_keys(loc)
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else (f"; known keys: {', '.join(known)}" if known else "")
            parts.append(f"{where}: unknown key{hint}{at}")
        else:
            message = str(item.get("msg", "invalid value")).removeprefix("Value error, ")
            parts.append(f"{where}: {message}{at}")
    return "config: " + "; ".join(parts)


def read_config_file(path: Path) -> dict[str, Any]:
    """The raw mapping of a YAML or TOML file; relative task paths are made relative to the file."""
    if not path.is_file():
        raise FileNotFoundError(f"config: no file at {path}")
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml"):
        raise ValueError(f"config: use a .yaml, .yml or .toml file, got {path.name}")
    kind = "TOML" if suffix == ".toml" else "YAML"
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"config: {path.name} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    try:
        if kind == "YAML":
            import yaml

            raw = yaml.safe_load(text)
        else:
            import tomllib

            raw = tomllib.loads(text)
    except Exception as exc:  # yaml.YAMLError has no common base with tomllib.TOMLDecodeError
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:  # YAML: where the parser gave up, and what it expected
            what = getattr(exc, "problem", None) or type(exc).__name__
            where = f"line {mark.line + 1}, column {mark.column + 1}"
        else:  # TOML: the message ends with "(at line L, column C)"
            what, _, position = str(exc).partition(" (at ")
            where = position.rstrip(")") or "unknown position"
        raise ValueError(
            f"config: {path.name} is not valid {kind} at {where}: {what}; fix the syntax there "
            f"(see docs/cli.md for a complete example)"
        ) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"config: {path.name} must hold a mapping of sections (task, engine, dp, output)")
    task = raw.get("task")
    if isinstance(task, dict):
        for key in ("train", "test", "public", "public_inputs"):
            value = task.get(key)
            if isinstance(value, str) and not Path(value).is_absolute():
                task[key] = str((path.parent / value).resolve())
    return raw


def build_settings(
    raw: dict[str, Any], overrides: dict[str, dict[str, Any]], source: Path | None = None
) -> OptimizeSettings:
    """Merge flag overrides (section -> key -> value, None = not given) into the file, then validate once."""
    merged = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for section, values in overrides.items():
        given = {k: v for k, v in values.items() if v is not None}
        if not given:
            continue
        current = merged.get(section)
        current = dict(current) if isinstance(current, dict) else {}
        if section == "task":
            # A flag naming the task replaces the file's choice of source.
            if "name" in given:  # the built-in task decides its family and its own settings
                for key in ("train", "test", "public", "kind", *GENERATE_ONLY):
                    current.pop(key, None)
            if "train" in given or "test" in given:
                current.pop("name", None)
        if section == "engine" and "kind" in given and given["kind"] != current.get("kind"):
            # Options of another engine kind do not carry over.
            for key in ("base_url", "mode", "options", "model"):
                current.pop(key, None)
        current.update(given)
        merged[section] = current
    dp = merged.get("dp")
    if isinstance(dp, dict) and "feedback" not in dp and not supports_feedback(dp.get("selection", "gaussian")):
        # DP feedback rides on the Gaussian scores; a charged selection has none unless asked.
        merged["dp"] = {**dp, "feedback": "none"}
    try:
        return OptimizeSettings.model_validate(merged)
    except ValidationError as exc:
        from dp_textgrad.dp_es.config import ConfigError

        raise ConfigError(format_settings_error(exc, source)) from None


def supports_feedback(selection: Any) -> bool:
    from dp_textgrad.dp_es.selector import SELECTION_STRATEGIES

    strategy = SELECTION_STRATEGIES.get(selection) if isinstance(selection, str) else None
    return strategy is None or strategy.supports_feedback  # an unknown name fails validation later
