"""The configuration file of ``dp-textgrad optimize``: its schema and how it is read.

Pydantic at the edge: every unknown key, wrong type or inconsistent pair is refused
with the key's dotted path and a suggestion, before anything runs.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dp_textgrad.dp_es.config import DPESConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


DEFAULT_FILE_SEED_PROMPT = "Read the text and name its label."


class TaskSection(_Section):
    """Either a built-in task (``name``) or the user's files (``train`` + ``test``)."""

    name: Optional[Literal["support", "sst2", "banking77"]] = Field(
        None, description="built-in task; its builder's arguments go in `options`")
    train: Optional[Path] = Field(None, description="private training file (.csv, .tsv or .jsonl)")
    test: Optional[Path] = Field(None, description="test file (evaluation only; its labels define the classes)")
    public: Optional[Path] = Field(None, description="public examples that may be shown to the LLM")
    text_column: str = "text"
    label_column: str = "label"
    labels: Optional[list[str]] = Field(None, description="the classes (default: the labels of the test file)")
    description: str = Field("", description="public description of the task, shown to the mutation LLM")
    record_template: Optional[str] = Field(None, description="how a record is shown, with {text}")
    seed_prompt: Optional[str] = Field(None, description="the prompt evolution starts from "
                                       f"(files: default {DEFAULT_FILE_SEED_PROMPT!r})")
    options: dict[str, Any] = Field(default_factory=dict, description="more keyword arguments of the task builder")

    @model_validator(mode="after")
    def _one_source(self) -> "TaskSection":
        files = {k: getattr(self, k) for k in ("train", "test", "public") if getattr(self, k) is not None}
        if self.name is not None and files:
            raise ValueError(f"give either name or train/test files, not both (got name and {', '.join(files)})")
        if self.name is None and (self.train is None or self.test is None):
            raise ValueError("give name (support, sst2, banking77) or both train and test files")
        return self

    def display_name(self) -> str:
        return self.name if self.name is not None else f"custom ({Path(self.train).name})"


class EngineSection(_Section):
    kind: Literal["llama_cpp", "openai", "transformers"] = Field(
        "llama_cpp",
        description="llama_cpp (embedded local model), openai (any OpenAI-compatible server), transformers")
    model: Optional[str] = Field(
        None, description="GGUF path (llama_cpp), model name (openai), name or path (transformers)")
    base_url: Optional[str] = Field(None, description="openai only: e.g. http://127.0.0.1:8080/v1")
    mode: Optional[Literal["chat", "completions"]] = Field(None, description="openai only")
    options: dict[str, Any] = Field(default_factory=dict, description="more keyword arguments of the engine")

    @model_validator(mode="after")
    def _consistent(self) -> "EngineSection":
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


class OutputSection(_Section):
    runs_root: Path = Field(Path("runs"), description="where run directories are created")
    evaluate: bool = Field(True, description="report test accuracy of the seed and released prompts (not DP)")


class OptimizeSettings(_Section):
    """The whole configuration file of ``dp-textgrad optimize``."""

    task: TaskSection = Field(default_factory=lambda: TaskSection(name="support"))
    engine: EngineSection = Field(default_factory=EngineSection)
    dp: DPESConfig = Field(default_factory=DPESConfig)
    output: OutputSection = Field(default_factory=OutputSection)


def _known_keys(loc: tuple[Any, ...]) -> list[str]:
    model: Any = OptimizeSettings
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        model = field.annotation if field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
    return list(model.model_fields)


def format_settings_error(error: ValidationError) -> str:
    """One clause per problem, naming the key; unknown keys get a spelling suggestion."""
    parts = []
    for item in error.errors():
        loc = tuple(item.get("loc", ()))
        where = ".".join(str(x) for x in loc) or "config"
        if item.get("type") == "extra_forbidden":
            known = _known_keys(loc)
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else (f"; known keys: {', '.join(known)}" if known else "")
            parts.append(f"{where}: unknown key{hint}")
        else:
            message = str(item.get("msg", "invalid value")).removeprefix("Value error, ")
            parts.append(f"{where}: {message}")
    return "config: " + "; ".join(parts)


def read_config_file(path: Path) -> dict[str, Any]:
    """The raw mapping of a YAML or TOML file; relative task paths are made relative to the file."""
    if not path.is_file():
        raise FileNotFoundError(f"config: no file at {path}")
    suffix = path.suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            import yaml

            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        elif suffix == ".toml":
            import tomllib

            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        else:
            raise ValueError(f"config: use a .yaml, .yml or .toml file, got {path.name}")
    except ValueError:
        raise
    except Exception as exc:  # yaml.YAMLError has no common base with tomllib.TOMLDecodeError
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"config: {path.name} is not valid {suffix.lstrip('.').upper()}: {first}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"config: {path.name} must hold a mapping of sections (task, engine, dp, output)")
    task = raw.get("task")
    if isinstance(task, dict):
        for key in ("train", "test", "public"):
            value = task.get(key)
            if isinstance(value, str) and not Path(value).is_absolute():
                task[key] = str((path.parent / value).resolve())
    return raw


def build_settings(raw: dict[str, Any], overrides: dict[str, dict[str, Any]]) -> OptimizeSettings:
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
            if "name" in given:
                for key in ("train", "test", "public"):
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
        return OptimizeSettings(**merged)
    except ValidationError as exc:
        from dp_textgrad.dp_es.config import ConfigError

        raise ConfigError(format_settings_error(exc)) from None


def supports_feedback(selection: Any) -> bool:
    from dp_textgrad.dp_es.selector import SELECTION_STRATEGIES

    strategy = SELECTION_STRATEGIES.get(selection) if isinstance(selection, str) else None
    return strategy is None or strategy.supports_feedback  # an unknown name fails validation later
