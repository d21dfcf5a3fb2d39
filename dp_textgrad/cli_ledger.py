"""``dp-textgrad ledger``: the lifetime budget of a dataset, read from the operator's store."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dp_textgrad.builders import build_task
from dp_textgrad.cli_common import EXIT_BAD_INPUT, _bad_input_types, _fail, console
from dp_textgrad.settings import build_settings, read_config_file


def ledger(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="the run's config file (its task section)"),
    task: Optional[str] = typer.Option(None, help="built-in task: support | sst2 | banking77 (task.name)"),
    train: Optional[Path] = typer.Option(None, "--dataset", "--train", help="the private training file (as given "
                                                                            "to optimize --train), or a declared "
                                                                            "dataset key"),
    dataset_key: Optional[str] = typer.Option(None, "--dataset-key", help="a dataset key declared with optimize "
                                                                          "--dataset-key (output.dataset_key)"),
    runs_root: Path = typer.Option(Path("runs"), help="runs root whose lifetime store is read"),
    store: Optional[Path] = typer.Option(None, help="lifetime store (default RUNS_ROOT/operator/lifetime_budget.sqlite)"),
    delta: Optional[float] = typer.Option(None, help="delta of the composed total (default: the dataset's "
                                                     "lifetime delta)"),
    all_datasets: bool = typer.Option(False, "--all", help="every dataset in the store (no data needed)"),
    text_column: str = typer.Option("text", help="--dataset: the text column"),
    label_column: str = typer.Option("label", help="--dataset: the label column"),
    encoding: str = typer.Option("utf-8-sig", help="--dataset: the file's encoding"),
) -> None:
    """The lifetime budget of a dataset: its runs and the composed epsilon of all their charges."""

    try:
        from dp_textgrad.lifetime_link import describe_dataset
        from dp_textgrad.privacy.accounting.lifetime import STORE_NAME, LifetimeBudget
        from dp_textgrad.runs import OPERATOR_DIR

        # Where the store would be, worked out without LifetimeOptions.store_path: that makes the
        # operator folder, and looking must create nothing.
        path = store if store is not None else runs_root / OPERATOR_DIR / STORE_NAME
        if not path.is_file():
            raise FileNotFoundError(f"store: no lifetime store yet at {path}; the first run under --runs-root "
                                    f"{runs_root} creates it there (or pass --store FILE)")
        the_store = LifetimeBudget(path)
        if all_datasets:
            if config is not None or task is not None or train is not None or dataset_key is not None:
                raise ValueError("--all: lists every dataset; do not also give --config, --task, --dataset or "
                                 "--dataset-key")
            datasets = the_store.datasets()
        elif dataset_key is not None:
            if config is not None or task is not None or train is not None:
                raise ValueError("--dataset-key: names the dataset; do not also give --config, --task or --dataset")
            datasets = [the_store.declared_key(dataset_key)]
        elif train is not None and config is None and task is None and not train.is_file():
            # Not a file: a dataset key the owner declared (public), if the store knows it.
            key = the_store.find_declared(str(train))
            if key is None:
                raise FileNotFoundError(f"--dataset: {train} is neither a file nor a dataset key with runs in "
                                        f"{path}; give the training file or the key passed to optimize "
                                        "--dataset-key")
            datasets = [key]
        elif train is not None and config is None and task is None:
            from dp_textgrad.privacy.data import PrivateDataset
            from dp_textgrad.tasks.loaders import load_classification_file

            records = load_classification_file(train, text_column, label_column, warn_imbalance=False,
                                               encoding=encoding)
            datasets = [the_store.fingerprint(PrivateDataset(records))]
        else:
            raw = read_config_file(config) if config is not None else {}
            settings = build_settings(raw, {"task": dict(name=task)}, source=config)
            if settings.output.dataset_key is not None:  # the run file names its dataset: no data read
                datasets = [the_store.declared_key(settings.output.dataset_key)]
            else:
                datasets = [the_store.fingerprint(build_task(settings.task).private_train)]
        if not datasets:
            console.print(f"No runs recorded in {path}.")
        for number, dataset in enumerate(datasets, start=1):
            for line in describe_dataset(the_store, dataset, number if all_datasets else None, delta):
                console.print(line, highlight=False, soft_wrap=True, markup=False)
    except typer.Exit:
        raise
    except _bad_input_types() as exc:
        _fail(exc, EXIT_BAD_INPUT)
