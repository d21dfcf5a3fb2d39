"""``dp-textgrad ledger``: the lifetime budget of a dataset, read from the operator's store."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def ledger(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="the run's config file (its task section)"),
    task: Optional[str] = typer.Option(None, help="built-in task: support | sst2 | banking77 (task.name)"),
    train: Optional[Path] = typer.Option(None, "--dataset", "--train", help="the private training file (as given "
                                                                            "to optimize --train)"),
    runs_root: Path = typer.Option(Path("runs"), help="runs root whose lifetime store is read"),
    store: Optional[Path] = typer.Option(None, help="lifetime store (default RUNS_ROOT/operator/lifetime_budget.sqlite)"),
    delta: Optional[float] = typer.Option(None, help="delta of the composed total (default: the largest delta "
                                                     "of the dataset's runs)"),
    all_datasets: bool = typer.Option(False, "--all", help="every dataset in the store (no data needed)"),
    text_column: str = typer.Option("text", help="--dataset: the text column"),
    label_column: str = typer.Option("label", help="--dataset: the label column"),
    encoding: str = typer.Option("utf-8-sig", help="--dataset: the file's encoding"),
) -> None:
    """The lifetime budget of a dataset: its runs and the composed epsilon of all their charges."""
    from dp_textgrad import cli  # the shared console and error handling (imported when the command runs)

    try:
        from dp_textgrad.lifetime import LifetimeOptions, describe_dataset
        from dp_textgrad.privacy.accounting.lifetime import LifetimeBudget

        path = LifetimeOptions(store=store).store_path(runs_root)
        if not path.is_file():
            raise FileNotFoundError(f"store: no lifetime store at {path}; runs under --runs-root create it "
                                    "(or pass --store)")
        the_store = LifetimeBudget(path)
        if all_datasets:
            if config is not None or task is not None or train is not None:
                raise ValueError("--all: lists every dataset; do not also give --config, --task or --dataset")
            datasets = the_store.datasets()
        elif train is not None and config is None and task is None:
            from dp_textgrad.privacy.data import PrivateDataset
            from dp_textgrad.tasks.loaders import load_classification_file

            records = load_classification_file(train, text_column, label_column, warn_imbalance=False,
                                               encoding=encoding)
            datasets = [the_store.fingerprint(PrivateDataset(records))]
        else:
            raw = cli.read_config_file(config) if config is not None else {}
            settings = cli.build_settings(raw, {"task": dict(name=task)}, source=config)
            datasets = [the_store.fingerprint(cli.build_task(settings.task).private_train)]
        if not datasets:
            cli.console.print(f"No runs recorded in {path}.")
        for number, dataset in enumerate(datasets, start=1):
            for line in describe_dataset(the_store, dataset, number if all_datasets else None, delta):
                cli.console.print(line, highlight=False, soft_wrap=True, markup=False)
    except typer.Exit:
        raise
    except cli._bad_input_types() as exc:
        cli._fail(exc, cli.EXIT_BAD_INPUT)
