"""``dp-textgrad federated``: DP-ES across silos on Flower; ``federated-split``: non-IID silo files;
``federated-app``: the Flower App of a federation, for ``flwr run`` across machines."""

from __future__ import annotations

from pathlib import Path

import typer

from dp_textgrad.cli._console import console, guarded
from dp_textgrad.cli.progress import epsilon_text


def federated(
    silos: Path | None = typer.Option(
        None, "--silos", "-s", help="the federation's settings (silos.yaml: task, engine, dp, output, federation)"
    ),
    placement: str | None = typer.Option(None, help="where the noise is added: central | distributed | local"),
    jse: str | None = typer.Option(
        None, help="James-Stein shrinkage: none | coordinator | silo (placement local only)"
    ),
    control_variate: bool | None = typer.Option(
        None, "--control-variate/--no-control-variate", help="remove each silo's drift (placement local only)"
    ),
    secure_aggregation: bool | None = typer.Option(
        None,
        "--secure-aggregation/--no-secure-aggregation",
        help="distributed only: the coordinator sees only the sum of the silos' values (Flower SecAgg+)",
    ),
    split_silos: int | None = typer.Option(
        None, "--split-silos", help="simulated silos dealt from the task (when silos.yaml lists none)"
    ),
    alpha: float | None = typer.Option(None, help="Dirichlet label skew of the simulated split"),
    transport: str | None = typer.Option(None, help="flower (simulation engine) | in_process"),
    epsilon: float | None = typer.Option(None, help="total budget epsilon (dp.epsilon)"),
    generations: int | None = typer.Option(None, help="DP generations (dp.generations)"),
    population: int | None = typer.Option(None, help="candidates per generation (dp.population)"),
    runs_root: Path | None = typer.Option(None, help="where run directories are created"),
    resume: Path | None = typer.Option(
        None, "--resume", help="continue the federated run in RUN_DIR from its checkpoint, with the settings it saved"
    ),
) -> None:
    """Optimise one prompt over several silos that never pool their records (docs/federated.md)."""
    from dp_textgrad import runs

    holder: dict[str, Path] = {}
    given = {
        "--silos": silos,
        "--placement": placement,
        "--jse": jse,
        "--control-variate": control_variate,
        "--secure-aggregation": secure_aggregation,
        "--split-silos": split_silos,
        "--alpha": alpha,
        "--transport": transport,
        "--epsilon": epsilon,
        "--generations": generations,
        "--population": population,
        "--runs-root": runs_root,
    }

    def action() -> None:
        from dp_textgrad.federated.run import run_federated, saved_settings

        if resume is not None:
            fixed = [k for k, v in given.items() if v is not None]
            if fixed:
                raise ValueError(
                    f"resume: {', '.join(fixed)} cannot be given with --resume; a federated run "
                    "continues with the settings it saved"
                )
            if not runs.RunDir(resume).checkpoint.is_file():
                raise ValueError(f"resume: no checkpoint.json in {resume}; nothing to resume")
            settings = saved_settings(resume)
            holder["dir"] = resume
        else:
            settings = _settings()
        fed = settings.federation
        try:
            import flwr  # noqa: F401
        except ImportError:
            if fed.transport != "in_process":
                raise ValueError(
                    "transport: the Flower simulation needs the federated extra: pip install "
                    "'dp-textgrad[federated]' (or pass --transport in_process)"
                ) from None
        where = (
            f"{len(fed.silos)} silos" if fed.silos else f"{fed.split.silos} simulated silos (alpha {fed.split.alpha:g})"
        )
        console.print(
            f"[bold]Federated DP-ES[/]{' (resumed)' if resume is not None else ''}: {where}, noise "
            f"placement [bold]{fed.placement}[/], "
            f"JSE {fed.jse}, control variate {'on' if fed.control_variate else 'off'}, "
            f"secure aggregation {'on' if fed.secure_aggregation else 'off'}, "
            f"epsilon {settings.dp.epsilon:g}, transport {fed.transport}",
            soft_wrap=True,
        )

        def progress(report) -> None:  # released fields only (the metrics channel)
            console.print(
                f"generation {report.generation}: best DP estimate {report.best_estimate:.3f} "
                f"(noise std {report.noise_std_estimate:.3f}), epsilon spent {epsilon_text(report.epsilon_spent, 3)}",
                highlight=False,
            )

        if resume is None:
            holder["dir"] = runs.new_run_dir(settings.output.runs_root, prefix="federated")
        outcome = run_federated(settings, progress=progress, run_dir=holder["dir"], resume=resume is not None)
        _print_outcome(outcome)

    def _settings():
        from dp_textgrad.federated.config import load_federated_settings

        settings = load_federated_settings(
            silos,
            {
                "federation": {
                    "placement": placement,
                    "jse": jse,
                    "control_variate": control_variate,
                    "secure_aggregation": secure_aggregation,
                    "transport": transport,
                },
                "dp": {"epsilon": epsilon, "generations": generations, "population": population},
                "output": {"runs_root": runs_root},
            },
        )
        if split_silos is not None or alpha is not None:
            split = settings.federation.split.model_copy(
                update={k: v for k, v in {"silos": split_silos, "alpha": alpha}.items() if v is not None}
            )
            federation = settings.federation.model_copy(update={"split": split})
            settings = settings.model_copy(update={"federation": federation})
        return settings

    def _print_outcome(outcome) -> None:
        console.print(f"Released prompt: {outcome.result.prompt}", highlight=False, markup=False, soft_wrap=True)
        for g in outcome.federation["guarantees"]:
            console.print(
                f"  ({epsilon_text(g['epsilon'], 3)}, {g['delta']:.1e})-DP per record against "
                f"{g['against']} [{g['holds_if']}]",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
        evaluation = outcome.federation.get("evaluation")
        if evaluation:
            console.print(
                f"Test accuracy (not covered by DP): seed {evaluation['seed_accuracy']:.3f} -> released "
                f"{evaluation['released_accuracy']:.3f} on {evaluation['n_test']} records",
                highlight=False,
            )
        console.print(f"Run directory: {outcome.run_dir}", soft_wrap=True, markup=False, highlight=False)

    guarded(action, lambda: holder.get("dir"), command="federated")


def federated_split(
    task: str = typer.Option(
        "sst2", help="built-in task whose private records are dealt out: support | sst2 | banking77"
    ),
    silos: int = typer.Option(10, min=1, help="number of silos"),
    alpha: float = typer.Option(0.3, help="Dirichlet label skew (0.3 skewed, 10 near IID)"),
    seed: int = typer.Option(0, help="seed of the split"),
    out: Path = typer.Option(Path("silos"), help="directory for silo-NN.csv and silos.yaml"),
) -> None:
    """Write a non-IID split of a built-in task into silo CSV files and a silos.yaml that uses them."""

    def action() -> None:
        import csv

        import numpy as np

        from dp_textgrad.federated.split import dirichlet_label_split, label_mix
        from dp_textgrad.tasks.registry import get_task

        the_task = get_task(task)
        records = [r.unwrap() for r in the_task.private_train]
        parts = dirichlet_label_split([r.label for r in records], silos, alpha, np.random.default_rng(seed))
        out.mkdir(parents=True, exist_ok=True)
        width = len(str(silos))
        lines = [f"task: {{name: {task}}}", "federation:", "  placement: central", "  silos:"]
        for i, part in enumerate(parts, start=1):
            name = f"silo-{i:0{width}d}"
            with (out / f"{name}.csv").open("w", newline="", encoding="utf-8") as handle:
                writer = csv.writer(handle)
                writer.writerow(["text", "label"])
                writer.writerows([records[int(j)].text, records[int(j)].label] for j in part)
            # The silo's size, declared public (a deployment needs it; without it a run on one machine
            # has each silo release a DP count instead, docs/federated.md "The dataset size").
            lines += [f"    - name: {name}", f"      train: {name}.csv", f"      size: {len(part)}"]
        (out / "silos.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
        mix = label_mix([r.label for r in records], parts, the_task.labels)
        console.print(
            f"{silos} silos of {task} (alpha {alpha:g}) in {out}: sizes {[len(p) for p in parts]}; "
            f"largest label share per silo {np.round(mix.max(axis=1), 2).tolist()}",
            soft_wrap=True,
            highlight=False,
        )

    guarded(action, lambda: None)


def federated_app(
    silos: Path = typer.Option(
        ...,
        "--silos",
        "-s",
        help="the federation's settings (every silo listed with its name, train file and declared size)",
    ),
    out: Path = typer.Option(Path("federation-app"), help="new directory for the Flower App"),
    runs_root: Path = typer.Option(
        Path("runs"), help="where the coordinator writes its run directories (on the SuperLink's machine)"
    ),
) -> None:
    """Write the Flower App that runs this federation across machines with `flwr run` (docs/federated.md)."""

    def action() -> None:
        from dp_textgrad.federated.config import load_federated_settings
        from dp_textgrad.federated.deploy import write_app

        app_dir = write_app(silos, out, runs_root)
        names = [s.name for s in load_federated_settings(silos).federation.silos or []]
        console.print(
            f"Flower App written to {app_dir}. At each organisation, next to its data and with its "
            "copy of the settings file:",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
        for name in names:
            console.print(
                f"  flower-supernode --superlink LINK_HOST:9091 --node-config "
                f'\'settings="{Path(silos).name}" silo="{name}"\' ...',
                soft_wrap=True,
                markup=False,
                highlight=False,
            )
        console.print(
            f"Then: flwr run {app_dir} CONNECTION --stream (a SuperLink connection in $FLWR_HOME/config.toml)",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )

    guarded(action, lambda: None)
