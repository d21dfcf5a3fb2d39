"""The federation's settings file (``silos.yaml``): task, engine, dp, output and federation.

``task``, ``engine``, ``dp`` and ``output`` are the sections of ``dp-textgrad optimize``;
``task`` gives the public parts (labels, templates, public examples, test split) and,
when ``federation.silos`` is not given, the records that ``federation.split`` deals out
to simulated silos. ``federation.silos`` lists real silos, one private file each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from dp_textgrad.dp_es.config import DPESConfig
from dp_textgrad.dp_es.selector import SELECTION_STRATEGIES
from dp_textgrad.federated.coordinator import Shrinkage
from dp_textgrad.federated.placement import NoisePlacement, check_estimators
from dp_textgrad.federated.secure_sum import check_secure_aggregation
from dp_textgrad.settings import EngineSection, OutputSection, Section, TaskSection, read_config_file


class SiloSection(Section):
    name: str = Field(min_length=1, description="the silo's name (public)")
    train: Path = Field(description="the silo's private file (.csv, .tsv or .jsonl); only the silo reads it")
    text_column: str = "text"
    label_column: str = "label"
    encoding: str = "utf-8-sig"
    max_epsilon: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="the silo's own cap on its records' epsilon (its own noise)"
    )
    size: int | None = Field(
        None,
        ge=1,
        description="the silo's public record count, declared by its owner "
        "(default: its record count, then treated as public)",
    )


class SplitSection(Section):
    silos: int = Field(3, ge=1, le=10_000, description="simulated silos dealt from the task's private records")
    alpha: float = Field(1.0, gt=0, allow_inf_nan=False, description="Dirichlet label skew (0.3 skewed, 10 near IID)")
    seed: int = Field(0, description="public seed of the split (a simulation tool, not a privacy mechanism)")


class FederationSection(Section):
    placement: NoisePlacement = Field("central", description="where the noise is added: central | distributed | local")
    jse: Shrinkage = Field(
        "none", description="James-Stein shrinkage: none | coordinator | silo (placement 'local' only)"
    )
    control_variate: bool = Field(
        False, description="remove each silo's drift with the reference candidate's score (placement 'local' only)"
    )
    secure_aggregation: bool = Field(
        False,
        description="placement 'distributed' only: the coordinator receives "
        "only the sum of the silos' values (Flower SecAgg+)",
    )
    silos: list[SiloSection] | None = Field(None, description="real silos, one private file each")
    split: SplitSection = Field(default_factory=SplitSection, description="simulated silos (when silos is not given)")
    silo_max_epsilon: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="default max_epsilon of every silo"
    )
    silo_accounts: Path | None = Field(
        None, description="where each silo keeps its own account file (default: the run directory's silo_accounts/)"
    )
    transport: Literal["flower", "in_process"] = Field("flower", description="Flower simulation, or direct calls")
    cpus_per_silo: float = Field(1.0, gt=0, description="CPUs Flower reserves per simulated silo")

    @model_validator(mode="after")
    def _consistent(self) -> FederationSection:
        if self.silos is not None:
            names = [s.name for s in self.silos]
            if not names:
                raise ValueError("silos: list at least one silo, or leave it out to simulate silos with split")
            if len(set(names)) != len(names):
                raise ValueError("silos: silo names must be unique")
        if self.placement == "central" and (self.jse != "none" or self.control_variate):
            raise ValueError(
                "jse: under placement 'central' there are no per-silo noisy estimates; use "
                "jse 'none' and control_variate false, or placement 'distributed'/'local'"
            )
        check_estimators(self.placement, self.jse, self.control_variate)
        silos = len(self.silos) if self.silos is not None else self.split.silos
        check_secure_aggregation(self.secure_aggregation, self.placement, silos, self.jse, self.control_variate)
        return self


class FederatedSettings(Section):
    task: TaskSection = Field(default_factory=lambda: TaskSection(name="support"))
    engine: EngineSection = Field(default_factory=EngineSection)
    dp: DPESConfig = Field(default_factory=DPESConfig)
    output: OutputSection = Field(default_factory=OutputSection)
    federation: FederationSection = Field(default_factory=FederationSection)

    @model_validator(mode="after")
    def _selection_fits_placement(self) -> FederatedSettings:
        if self.task.kind != "classify":
            # Silos read label files and send confusion counts; generation tasks are not federated yet.
            raise ValueError(
                f"task.kind: federated runs take classification tasks only, and this task is kind "
                f"{self.task.kind}; run it with `dp-textgrad optimize` (one data holder) or use a "
                "classification task"
            )
        if self.federation.placement != "central":
            # Only scores noised at the silos can be released; a charged selection reads raw totals.
            if not SELECTION_STRATEGIES[self.dp.selection].releases_scores or self.dp.final_selection != "last":
                raise ValueError(
                    "dp.selection: silos that add their own noise send no un-noised totals for a "
                    "selection mechanism; set dp.selection 'gaussian' and dp.final_selection 'last'"
                )
            if self.dp.privacy == "off":
                raise ValueError("dp.privacy: 'off' needs un-noised totals; use placement 'central'")
        if self.dp.labelling is not None:
            # Teachers would need every silo's records at the coordinator; a per-silo vote is not built.
            raise ValueError(
                "dp.labelling: federated runs have no labelling phase yet (the teachers' records stay in "
                "the silos); remove dp.labelling, or give public labelled examples (task.public)"
            )
        if self.dp.mode == "unsafe":
            raise ValueError(
                "dp.mode: 'unsafe' shows raw records to the mutator, which a federation "
                "never sends to the coordinator; use 'public'"
            )
        return self


def load_federated_settings(path: Path | None, overrides: dict[str, Any] | None = None) -> FederatedSettings:
    """Read ``silos.yaml`` (or TOML/JSON), apply ``overrides`` (section -> key -> value), validate."""
    raw = read_config_file(path) if path is not None else {}
    for section, values in (overrides or {}).items():
        kept = {k: v for k, v in values.items() if v is not None}
        if kept:
            raw.setdefault(section, {}).update(kept)
    if path is not None:
        base = path.resolve().parent  # silo files are relative to the settings file
        for silo in (raw.get("federation", {}) or {}).get("silos") or []:
            if isinstance(silo, dict) and "train" in silo and not Path(str(silo["train"])).is_absolute():
                silo["train"] = str(base / str(silo["train"]))
        federation = raw.get("federation") or {}
        accounts = federation.get("silo_accounts") if isinstance(federation, dict) else None
        if accounts is not None and not Path(str(accounts)).is_absolute():
            federation["silo_accounts"] = str(base / str(accounts))
    try:
        return FederatedSettings.model_validate(raw)
    except ValidationError as exc:
        where = f"{path}: " if path is not None else ""
        lines = [f"{where}{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors()]
        raise ValueError("; ".join(lines)) from None


__all__ = ["FederatedSettings", "FederationSection", "SiloSection", "SplitSection", "load_federated_settings"]
