"""The federation across machines: Flower's Deployment Runtime (one SuperLink, one SuperNode per
organisation, ``flwr run``).

Every party holds the same public settings file (``silos.yaml``: task, engine, dp, and under
``federation.silos`` each silo's name and declared ``size``). An organisation starts a SuperNode
next to its data and tells it which silo it is::

    flower-supernode --insecure --superlink LINK_HOST:9091 \\
        --node-config 'settings="/path/to/silos.yaml" silo="hospital-a"'

That SuperNode reads only its own ``train`` file (relative paths: to its settings file) and
keeps its own account (``federation.silo_accounts``, else ``silo_accounts/`` beside its
settings file). The coordinator's ServerApp runs at the SuperLink from a Flower App that
:func:`write_app` makes (``dp-textgrad federated-app``): it holds a copy of the settings and
reads the silos' names and declared sizes, never their files. ``flwr run APP CONNECTION``
starts a run; its run directory appears under the run config's ``runs-root`` on the
SuperLink's machine.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dp_textgrad import runs
from dp_textgrad.federated.config import FederatedSettings, load_federated_settings
from dp_textgrad.federated.run import (
    EngineFactory,
    SiloBuilder,
    coordinate_federated,
    public_task,
    resolved_config,
)
from dp_textgrad.federated.silo import Silo

if TYPE_CHECKING:
    from dp_textgrad.workflow import RunOutcome

SETTINGS_IN_APP = "federation.yaml"
APP_MODULE = "dp_textgrad_federation"


def deployed_silos(settings: FederatedSettings) -> tuple[list[str], list[int]]:
    """The silos' public names and declared sizes: all a coordinator of a deployment knows of them."""
    silos = settings.federation.silos
    if silos is None:
        raise ValueError(
            "federation.silos: a deployment needs its real silos listed (name, train, size); "
            "federation.split only simulates silos on one machine"
        )
    if settings.task.train is not None:
        raise ValueError(
            "task.train: the coordinator of a deployment reads no private file; name a built-in task "
            "(task.name) for its public parts (custom task files across machines: not supported yet)"
        )
    missing = [s.name for s in silos if s.size is None]
    if missing:
        raise ValueError(
            f"federation.silos: declare size (the public record count) of every silo for a deployment; "
            f"missing for {', '.join(missing)} (the coordinator never reads a silo's file)"
        )
    return [s.name for s in silos], [int(s.size) for s in silos]  # type: ignore[arg-type]


class SuperNodeSilo:
    """What a SuperNode serves: the silo its node config names, built from its own file only."""

    def __init__(self, engine_factory: EngineFactory | None = None) -> None:
        self.engine_factory = engine_factory
        self.settings_path: Path | None = None
        self.settings: FederatedSettings | None = None
        self.index: int | None = None

    def locate(self, context: Any) -> int:
        """This SuperNode's silo index, from ``--node-config 'settings="..." silo="NAME"'``."""
        if self.index is None:
            config = context.node_config
            for key in ("settings", "silo"):
                if key not in config:
                    raise ValueError(
                        f"node-config: {key} is missing; start the SuperNode with --node-config "
                        '\'settings="/path/to/silos.yaml" silo="NAME"\''
                    )
            self.settings_path = Path(str(config["settings"])).resolve()
            self.settings = load_federated_settings(self.settings_path)
            names, _ = deployed_silos(self.settings)
            name = str(config["silo"])
            if name not in names:
                raise ValueError(
                    f"node-config silo: {name!r} is not a silo of {self.settings_path} (its silos: {', '.join(names)})"
                )
            self.index = names.index(name)
        return self.index

    def __call__(self, index: int) -> Silo:
        from dp_textgrad.tasks.loaders import load_classification_file

        settings, path = self.settings, self.settings_path
        if settings is None or path is None:
            raise RuntimeError("SuperNodeSilo: locate the silo (its node config) before building it")
        federation = settings.federation
        names, sizes = deployed_silos(settings)
        task = settings.task.build()
        own = federation.silos[index]  # type: ignore[index]
        records: list[list[Any]] = [[] for _ in names]  # the other silos' records stay with them
        records[index] = load_classification_file(
            own.train,
            own.text_column,
            own.label_column,
            labels=task.labels,
            warn_imbalance=False,
            encoding=own.encoding,
        )
        caps = [s.max_epsilon if s.max_epsilon is not None else federation.silo_max_epsilon for s in federation.silos]  # type: ignore[union-attr]
        config = resolved_config(settings, sizes)
        accounts = (
            Path(federation.silo_accounts)
            if federation.silo_accounts is not None
            else path.parent / runs.SILO_ACCOUNTS_DIR
        )
        engine_factory = self.engine_factory or settings.engine.factory()
        builder = SiloBuilder(
            public_task(task, sizes),
            names,
            records,
            engine_factory,
            federation.placement,
            federation.jse == "silo",
            caps,
            float(config.delta),
            config.max_record_tokens,
            config.long_records,
            config.insecure_noise_seed,
            sizes,
            accounts,
            secure_aggregation=federation.secure_aggregation,
        )
        return builder(index)


def client_app(engine_factory: EngineFactory | None = None) -> Any:
    """The ClientApp every organisation's SuperNode runs (its silo: ``--node-config``)."""
    from dp_textgrad.federated.flower_app import make_client_app

    silo = SuperNodeSilo(engine_factory)
    return make_client_app(silo, locate=silo.locate)


def coordinate_deployment(
    settings: FederatedSettings, grid: Any, run_dir: Path, engine_factory: EngineFactory | None = None, task: Any = None
) -> RunOutcome:
    """The coordinator's run over a Flower ``grid`` of SuperNodes, one per silo of ``settings``."""
    from dp_textgrad.federated.flower_app import FlowerGrid

    names, sizes = deployed_silos(settings)
    task = task if task is not None else settings.task.build()
    engine_factory = engine_factory or settings.engine.factory()
    deployed = settings.model_copy(
        update={"federation": settings.federation.model_copy(update={"transport": "flower"})}
    )
    return coordinate_federated(
        deployed,
        names,
        sizes,
        lambda coordinate: coordinate(FlowerGrid(grid, len(sizes))),
        engine_factory=engine_factory,
        task=task,
        run_dir=run_dir,
    )


def server_app(settings_path: Path, engine_factory: EngineFactory | None = None) -> Any:
    """The coordinator's ServerApp: the settings at ``settings_path`` (shipped in the Flower App), the run
    directory under the run config's ``runs-root`` (on the SuperLink's machine)."""
    from flwr.serverapp import ServerApp

    app = ServerApp()

    @app.main()
    def main(grid: Any, context: Any) -> None:
        settings = load_federated_settings(Path(settings_path))
        root = Path(str(context.run_config.get("runs-root") or settings.output.runs_root))
        outcome = coordinate_deployment(settings, grid, runs.new_run_dir(root, prefix="federated"), engine_factory)
        print(f"federated run finished: {outcome.run_dir}", flush=True)

    return app


_PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "1.0.0"
description = "dp-textgrad federated DP-ES: the coordinator's ServerApp and the silos' ClientApp"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "dp-textgrad"
# Only these two files travel in the Flower App: never data that happens to sit beside them.
fab-include = ["{module}.py", "{settings}"]

[tool.flwr.app.components]
serverapp = "{module}:server"
clientapp = "{module}:client"

[tool.flwr.app.config]
runs-root = "{runs_root}"
"""

_MODULE = '''"""Flower App of a dp-textgrad federation (written by `dp-textgrad federated-app`)."""

from pathlib import Path

from dp_textgrad.federated.deploy import client_app, server_app

server = server_app(Path(__file__).resolve().parent / "{settings}")
client = client_app()
'''


def write_app(settings_path: Path, out_dir: Path, runs_root: Path, name: str = "dp-textgrad-federation") -> Path:
    """Write the Flower App of the federation in ``settings_path`` into ``out_dir`` (checked first)."""
    settings = load_federated_settings(Path(settings_path))
    deployed_silos(settings)
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ValueError(f"out: {out_dir} is not empty; name a new directory for the Flower App")
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(settings_path, out_dir / SETTINGS_IN_APP)
    fields = dict(
        name=name, module=APP_MODULE, settings=SETTINGS_IN_APP, runs_root=Path(runs_root).resolve().as_posix()
    )
    (out_dir / "pyproject.toml").write_text(_PYPROJECT.format(**fields), encoding="utf-8")
    (out_dir / f"{APP_MODULE}.py").write_text(_MODULE.format(**fields), encoding="utf-8")
    return out_dir


__all__ = [
    "APP_MODULE",
    "SETTINGS_IN_APP",
    "SuperNodeSilo",
    "client_app",
    "coordinate_deployment",
    "deployed_silos",
    "server_app",
    "write_app",
]
