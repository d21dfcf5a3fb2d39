"""Run directories: what a run saves, and the run log every run appends to.

``runs/<id>/`` holds the configuration, the ledger, checkpoints, per-generation noisy
metrics, the released prompt and the report (plus ``audit.json`` after an end-to-end
canary audit, see :mod:`dp_textgrad.audit.end_to_end`, and the federation's files after a
federated run, see :mod:`dp_textgrad.federated.run`). Nothing in it holds raw private
text unless the run was in unsafe mode (and then the report says so at the top).

Every file name written into a run directory or the runs root is a ``*_NAME`` (folders:
``*_DIR``) constant of this module; code elsewhere reaches them through :class:`RunDir`
or these constants, never by spelling them (``tests/test_architecture.py`` checks).

Every structured file goes through :mod:`dp_textgrad.privacy.release`: its released part is
written here, its operator-only part under ``operator/`` (real private-phase usage and
time, raw engine error text), which nothing that is shared reads.

Clocks are released too: every file and folder of a run directory outside ``operator/``, and
the run log, carries the fixed modification time :data:`RELEASED_FILE_TIME`, never the time it
was written (which would time the private phase, and survives tar, zip and copies).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import secrets
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dp_textgrad import __version__, _io
from dp_textgrad.privacy import release

# The runs root: the run log, and (under operator/) the lifetime store of every dataset's budget.
RUN_LOG_NAME = "run_metadata.jsonl"
LIFETIME_STORE_NAME = "lifetime_budget.sqlite"  # under <runs_root>/operator/ unless output.lifetime_store says
# A run directory.
CONFIG_NAME = "config.json"
CHECKPOINT_NAME = "checkpoint.json"
LEDGER_NAME = "ledger.jsonl"
METRICS_NAME = "metrics.jsonl"
RESULT_NAME = "result.json"
PROMPT_NAME = "released_prompt.txt"
REPORT_NAME = "report.md"
REPORT_HTML_NAME = "report.html"
PLOTS_DIR = "plots"
ACCURACY_PLOT_NAME = "accuracy.png"  # under plots/, as the four below
EPSILON_PLOT_NAME = "epsilon.png"
SCORES_PLOT_NAME = "scores.png"
LINEAGE_PLOT_NAME = "lineage.png"
AUDIT_ROC_PLOT_NAME = "audit_roc.png"
AUDIT_NAME = "audit.json"
CLI_SETTINGS_NAME = "cli_settings.json"  # under operator/: the run file's settings, absolute paths included
# A federated run's directory, besides the files above (docs/federated.md).
FEDERATION_NAME = "federation.json"  # placement, public silo sizes, guarantee per adversary
FEDERATION_SETTINGS_NAME = "federation_settings.json"  # the settings it started with (what --resume reads)
SILO_COUNTS_NAME = "silo_counts.json"  # each silo's public size: declared, or its DP count
SECURE_SUM_COUPLING_NAME = "secure_sum_coupling.json"  # the fixed-point sums' coupling error so far (public)
SILO_ACCOUNTS_DIR = "silo_accounts"  # each silo's own account (default place)
# operator/: what is never shared.
OPERATOR_DIR = "operator"
OPERATOR_README_NAME = "README.txt"
RELEASES_DIR = "releases"  # under operator/: the write-ahead journal of releases, one file per charge
RUN_SECRET_NAME = "run_secret"  # under operator/: the seed of every charge's subsample (never released)
ERRORS_LOG_NAME = "errors.log"  # under operator/: raw engine error text
AUDIT_SECONDS_NAME = "audit_seconds.json"  # under operator/: an end-to-end audit's wall time
# The modification time of every released file and folder (2000-01-01T00:00:00Z): a constant, so
# every writer and every later command (report, audit) stamps alike without state; zip stores no
# time before 1980, so not the epoch. Files under operator/ keep their real times.
RELEASED_FILE_TIME = 946684800.0
OPERATOR_README = (
    "Operator-only values: derived from private data WITHOUT noise (real usage, tokens and wall time of\n"
    "the private scoring phase; raw engine error text). They are not covered by the run's (epsilon, delta)\n"
    "guarantee. Do not share this folder; reports, result.json, metrics.jsonl and the run log never read it.\n"
)


@dataclass(frozen=True, init=False)
class RunDir:
    """The paths of a run directory that runs and resumes use (every file name is a constant above)."""

    path: Path

    def __init__(self, path: str | Path) -> None:
        object.__setattr__(self, "path", Path(path))

    @property
    def ledger(self) -> Path:
        return self.path / LEDGER_NAME

    @property
    def checkpoint(self) -> Path:
        return self.path / CHECKPOINT_NAME

    @property
    def metrics(self) -> Path:
        return self.path / METRICS_NAME

    @property
    def config(self) -> Path:
        return self.path / CONFIG_NAME

    @property
    def result(self) -> Path:
        return self.path / RESULT_NAME

    @property
    def prompt(self) -> Path:
        return self.path / PROMPT_NAME

    @property
    def report(self) -> Path:
        return self.path / REPORT_NAME

    @property
    def report_html(self) -> Path:
        return self.path / REPORT_HTML_NAME

    @property
    def plots(self) -> Path:
        return self.path / PLOTS_DIR

    @property
    def audit(self) -> Path:
        return self.path / AUDIT_NAME

    @property
    def cli_settings(self) -> Path:
        """The command line's settings (operator-only: they hold the private file's path and name), which
        ``optimize --resume`` rebuilds the task and engine from; a run made before they moved under
        operator/ keeps them beside its other files."""
        legacy = self.path / CLI_SETTINGS_NAME
        return legacy if legacy.is_file() else self.operator / CLI_SETTINGS_NAME

    @property
    def federation(self) -> Path:
        return self.path / FEDERATION_NAME

    @property
    def federation_settings(self) -> Path:
        return self.path / FEDERATION_SETTINGS_NAME

    @property
    def silo_counts(self) -> Path:
        return self.path / SILO_COUNTS_NAME

    @property
    def secure_sum_coupling(self) -> Path:
        return self.path / SECURE_SUM_COUPLING_NAME

    @property
    def silo_accounts(self) -> Path:
        """Where a federated run's silos keep their accounts unless ``federation.silo_accounts`` says."""
        return self.path / SILO_ACCOUNTS_DIR

    @property
    def operator(self) -> Path:
        """The operator-only folder (not created here: :func:`operator_dir` creates it with its README)."""
        return self.path / OPERATOR_DIR

    @property
    def releases(self) -> Path:
        """The journal of releases (operator-only): ``releases/<ledger index>.json``."""
        return self.operator / RELEASES_DIR

    def release(self, index: int) -> Path:
        """The journal entry of the charge at ledger index ``index``."""
        return self.releases / f"{index}.json"

    @property
    def run_secret(self) -> Path:
        return self.operator / RUN_SECRET_NAME

    @property
    def errors_log(self) -> Path:
        return self.operator / ERRORS_LOG_NAME

    @property
    def audit_seconds(self) -> Path:
        return self.operator / AUDIT_SECONDS_NAME

    def read_state(self) -> RunState:
        if not self.checkpoint.exists():
            raise FileNotFoundError(self.missing_checkpoint_message())
        return RunState.from_dict(read_json(self.checkpoint))

    def resume_state(self) -> RunState:
        """The checkpoint a resumed run continues from; metrics lines past it are dropped (the
        generations they describe are run again, from the journal where it has their releases)."""
        state = self.read_state()
        self.trim_metrics(state.generation)
        return state

    def saved_config(self) -> dict[str, Any]:
        """The run's DP configuration: config.json's, or the checkpoint's when a kill came between
        the first checkpoint and config.json."""
        if self.config.is_file():
            return dict(read_json(self.config)["config"])
        return dict(self.read_state().config)

    def charges_recorded(self) -> int:
        """Entries in the ledger file (0 when there is none): lines after its header."""
        if not self.ledger.is_file():
            return 0
        lines = [line for line in self.ledger.read_text(encoding="utf-8").splitlines() if line.strip()]
        return max(0, len(lines) - 1)

    def missing_checkpoint_message(self) -> str:
        """Why ``--resume`` cannot continue a directory without a checkpoint, and what to do instead."""
        if self.cli_settings.is_file():
            again = f"start it again with `dp-textgrad optimize` and the same settings (saved in {self.cli_settings})"
        elif self.config.is_file():
            again = f"start a new run with the same settings (saved in {self.config})"
        else:
            return f"resume: no {CHECKPOINT_NAME} in {self.path}; is this a run directory?"
        charged = self.charges_recorded()
        if charged == 0:  # a checkpoint is written before the first charge: without one, nothing was charged
            return (
                f"resume: the run in {self.path} stopped before its first charge, so nothing was spent and "
                f"there is nothing to resume; {again}"
            )
        return (
            f"resume: the run in {self.path} stopped before its first checkpoint; its {charged} charge(s) stay "
            f"in its ledger and there is nothing to resume; {again}"
        )

    def read_or_create_secret(self) -> tuple[bytes, bool]:
        """The run's secret (128 bits from ``secrets``, operator-only), and whether it existed
        before this call. Written atomically before the first charge; never released."""
        if self.run_secret.is_file():
            return bytes.fromhex(self.run_secret.read_text(encoding="ascii").strip()), True
        secret = secrets.token_bytes(16)
        operator_dir(self.path)
        _io.atomic_write_text(self.run_secret, secret.hex() + "\n")
        return secret, False

    def trim_metrics(self, generations: int) -> None:
        """Keep the metrics lines of generations before ``generations`` (on resume: a line written
        for a generation whose checkpoint was not, is written again when it is replayed)."""
        for path in (self.metrics, self.operator / METRICS_NAME):
            if not path.is_file():
                continue
            lines = list(_io.read_jsonl(path))
            kept = [line for line in lines if int(line.get("generation", -1)) < generations]
            if len(kept) != len(lines):
                released = path == self.metrics
                _io.atomic_write_text(
                    path,
                    "".join(json.dumps(line, sort_keys=True) + "\n" for line in kept),
                    RELEASED_FILE_TIME if released else None,
                )

    def write_state(self, state: RunState) -> None:
        _io.atomic_write_json(self.checkpoint, release.released("checkpoint", state.to_dict()), RELEASED_FILE_TIME)


CHECKPOINT_FORMAT = 2  # 1: the calibrated parameter stored as noise_multiplier / selection_epsilon


@dataclass
class RunState:
    """What a checkpoint holds: enough to continue a run exactly where it stopped.

    ``plan_value`` is the calibrated parameter, so a resumed run continues with it and
    never recalibrates. The DP noise generator's state is never saved: it would let a
    reader subtract the noise.
    """

    generation: int
    config: dict[str, Any]
    plan_value: float | None
    population: dict[str, Any]
    public_rng_state: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    stopped_because: str | None = None
    variable_value: str | None = None
    charges: int | None = None  # ledger entries when the checkpoint was written (None: older checkpoints)
    interrupted_charges: int = 0  # charges of interrupted generations so far (spent, no result)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": CHECKPOINT_FORMAT,
            "generation": self.generation,
            "config": self.config,
            "plan_value": self.plan_value,
            "population": self.population,
            "public_rng_state": self.public_rng_state,
            "history": self.history,
            "stopped_because": self.stopped_because,
            "variable_value": self.variable_value,
            "charges": self.charges,
            "interrupted_charges": self.interrupted_charges,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunState:
        version = data.get("format")
        if version == 1:  # the parameter had one field per kind; exactly one was set
            value = data.get("noise_multiplier")
            value = data.get("selection_epsilon") if value is None else value
        elif version == CHECKPOINT_FORMAT:
            value = data.get("plan_value")
        else:
            raise ValueError(
                f"format: unsupported checkpoint format {version!r} (this version reads 1 and "
                f"{CHECKPOINT_FORMAT}); upgrade dp-textgrad"
            )
        return cls(
            generation=int(data["generation"]),
            config=dict(data["config"]),
            plan_value=None if value is None else float(value),
            population=dict(data["population"]),
            public_rng_state=dict(data["public_rng_state"]),
            history=list(data.get("history", [])),
            stopped_because=data.get("stopped_because"),
            variable_value=data.get("variable_value"),
            charges=None if data.get("charges") is None else int(data["charges"]),
            interrupted_charges=int(data.get("interrupted_charges") or 0),
        )


#: The environment variable naming the folder where the integrations (DSPy, GEPA) keep their runs
#: when given no ``run_dir`` or ``runs_root`` (:func:`default_runs_root`).
HOME_ENV = "DP_TEXTGRAD_HOME"


def default_runs_root() -> Path:
    """The runs root of a library call given none: ``$DP_TEXTGRAD_HOME/runs``, else ``runs`` under
    the user's data folder (``~/.local/share/dp-textgrad`` on Linux, platformdirs' rule elsewhere).

    Not the working directory: a DSPy compile or a GEPA call should leave it as it was. Not a
    temporary folder either: the runs root holds the lifetime store (``operator/``), the record of
    what each private dataset has spent over all its runs, and a folder that vanishes would start
    every dataset's lifetime budget again at zero."""
    home = os.environ.get(HOME_ENV, "").strip()
    if home:
        return Path(home).expanduser() / "runs"
    import platformdirs  # a dependency; imported here so that importing this module stays light

    return platformdirs.user_data_path("dp-textgrad") / "runs"


def new_run_dir(root: str | Path = "runs", prefix: str = "run") -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(root) / f"{prefix}-{stamp}-{secrets.token_hex(2)}"
    try:
        path.mkdir(parents=True, exist_ok=False)
    except FileExistsError:
        raise
    except OSError as exc:
        raise OSError(
            f"output.runs_root: cannot create a run directory in {root} ({exc.strerror or exc}); "
            "choose a writable --runs-root; nothing was charged"
        ) from None
    return path


def check_writable(directory: str | Path) -> None:
    """Fail before any charge if ``directory`` cannot take a file (permissions, full disk)."""
    probe = Path(directory) / f".write-check-{secrets.token_hex(4)}"
    try:
        with probe.open("wb") as handle:
            handle.write(b"0" * 4096)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        raise OSError(
            f"output: cannot write in {directory} ({exc.strerror or exc}); free space or choose another "
            "output.runs_root; nothing was charged"
        ) from None
    finally:
        try:
            probe.unlink()
        except OSError:
            pass


def code_version() -> str:
    """The package version plus the git commit (``-dirty`` with local edits) when run from a checkout."""
    here = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(here), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{__version__}+{commit}" if commit else __version__


def machine_summary() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def operator_dir(run_dir: str | Path) -> Path:
    """``<run_dir>/operator/``, created with its do-not-share README."""
    path = Path(run_dir) / OPERATOR_DIR
    created = not path.is_dir()
    path.mkdir(parents=True, exist_ok=True)
    readme = path / OPERATOR_README_NAME
    if not readme.exists():
        _io.atomic_write_text(readme, OPERATOR_README)
    if created:  # the new entry changed the released folder's time (perhaps in the private phase)
        _io.set_mtime(run_dir, RELEASED_FILE_TIME)
    return path


def stamp_released(run_dir: str | Path) -> None:
    """Give every file and folder of ``run_dir`` outside ``operator/`` (the folder itself last) the
    public time :data:`RELEASED_FILE_TIME`.

    Called at the end of every path that writes into a run directory, so a write that left a real
    time (a kill in between, a writer that forgot) is stamped by the next one.
    """
    top = Path(run_dir)
    if not top.is_dir():
        return
    folders: list[Path] = []
    for here, subfolders, files in os.walk(top):
        if Path(here) == top and OPERATOR_DIR in subfolders:
            subfolders.remove(OPERATOR_DIR)  # operator-only: its real times stay
        for name in files:
            _stamp(Path(here) / name)
        folders.append(Path(here))
    for folder in reversed(folders):  # deepest first, the run directory last
        _stamp(folder)


def _stamp(path: Path) -> None:
    try:
        os.utime(path, (RELEASED_FILE_TIME, RELEASED_FILE_TIME), follow_symlinks=False)
    except FileNotFoundError:  # a temporary file renamed or removed meanwhile
        pass


def lifetime_store(runs_root: str | Path) -> Path:
    """The default lifetime store of the datasets run under ``runs_root`` (not created here)."""
    return Path(runs_root) / OPERATOR_DIR / LIFETIME_STORE_NAME


def silo_account_name(index: int, name: str) -> str:
    """Silo ``index``'s account file name in its accounts folder (its public name, made safe for a file system)."""
    return f"{index + 1:03d}-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)[:64]}.json"


def silo_account_lock(account: str | Path) -> Path:
    """The lock file beside a silo's account file (one writer at a time)."""
    return Path(f"{account}.lock")


def write_released_json(run_dir: str | Path, name: str, channel: str, payload: dict[str, Any]) -> None:
    """Write ``payload``'s released part to ``<run_dir>/<name>``, its operator-only part under operator/."""
    public, private = release.split(channel, payload)
    if private:
        _io.atomic_write_json(operator_dir(run_dir) / name, private)
    _io.atomic_write_json(Path(run_dir) / name, public, RELEASED_FILE_TIME)


def append_released_jsonl(
    run_dir: str | Path, name: str, channel: str, record: dict[str, Any], key: dict[str, Any] | None = None
) -> None:
    """Append ``record``'s released part to ``<run_dir>/<name>``; the operator-only part, with ``key``
    (public identifiers such as the generation), to ``operator/<name>``."""
    public, private = release.split(channel, record)
    if private:
        _io.append_jsonl(operator_dir(run_dir) / name, {**(key or {}), **private})
    _io.append_jsonl(Path(run_dir) / name, public, RELEASED_FILE_TIME)


def write_operator_json(run_dir: str | Path, name: str, payload: Any) -> None:
    _io.atomic_write_json(operator_dir(run_dir) / name, payload)


def append_operator_text(run_dir: str | Path, name: str, text: str) -> Path:
    path = operator_dir(run_dir) / name
    with path.open("a", encoding="utf-8") as handle:
        handle.write(text.rstrip("\n") + "\n")
    return path


def append_run_log(
    root: str | Path, record: dict[str, Any], run_dir: str | Path | None = None, channel: str = "run_log"
) -> Path:
    """Append one JSON line to ``<root>/run_metadata.jsonl`` (safe under concurrent runs).

    Its operator-only fields go to ``<run_dir>/operator/run_metadata.jsonl`` instead (and
    nowhere when no run directory is given). The log keeps the public file time: appended at a
    run's end, its own time would time the run.
    """
    path = Path(root) / RUN_LOG_NAME
    entry = {"code_version": code_version(), **record}
    public, private = release.split(channel, entry)
    if private and run_dir is not None:
        _io.append_jsonl(operator_dir(run_dir) / RUN_LOG_NAME, private)
    _io.append_jsonl(path, public, RELEASED_FILE_TIME)
    return path


def read_run_log(root: str | Path) -> Iterator[dict[str, Any]]:
    """Every well-formed line of the run log; corrupted lines are skipped."""
    return _io.read_jsonl(Path(root) / RUN_LOG_NAME)


def write_json(path: str | Path, payload: Any) -> None:
    """Write a released JSON file of a run directory, atomically, with the public file time."""
    _io.atomic_write_json(path, payload, RELEASED_FILE_TIME)


def write_released_text(path: str | Path, text: str) -> None:
    """Write a released text file of a run directory (the released prompt), as :func:`write_json`."""
    _io.atomic_write_text(path, text, RELEASED_FILE_TIME)


def write_released_bytes(path: str | Path, data: bytes) -> None:
    """Write a released binary file of a run directory (a plot), as :func:`write_json`."""
    _io.atomic_write_bytes(path, data, RELEASED_FILE_TIME)


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))
