"""``dp-textgrad budget``: the calibration calculator; ``dp-textgrad ledger``: a dataset's lifetime budget.

Neither reads private records for its numbers (``ledger`` reads a data file only to find its
fingerprint in the operator's store). Both import what they use when they run, so that
``dp-textgrad budget`` starts without the engines, TextGrad or the audits.
"""

from __future__ import annotations

import math
from pathlib import Path

import typer
from pydantic import ValidationError

from dp_textgrad.cli._console import EXIT_BAD_INPUT, bad_input_types, config_from, console, fail


def budget(
    epsilon: float | None = typer.Option(None, help="target epsilon: prints the calibrated noise"),
    delta: float = typer.Option(1e-5, help="delta"),
    generations: int = typer.Option(6, help="DP generations T"),
    population: int = typer.Option(6, help="candidates per generation K"),
    parents: int = typer.Option(2, help="parents per generation k"),
    sampling_rate: float = typer.Option(0.1, help="Poisson sampling rate q"),
    selection: str = typer.Option("gaussian", help="gaussian | exponential | permute_and_flip"),
    feedback: str | None = typer.Option(
        None, help="dp_confusion | none (default: dp_confusion where the selection supports it)"
    ),
    noise_multiplier: float | None = typer.Option(None, help="given noise: prints epsilon under every accountant"),
    selection_epsilon: float | None = typer.Option(None, help="given epsilon0 (charged selections): prints epsilon"),
    llm_operators: bool | None = typer.Option(
        None,
        "--llm-operators/--no-llm-operators",
        help="whether LLM operators read the DP feedback (default: as optimize decides it for the engine: off "
        "for the built-in base model, whose runs charge no feedback; on for openai, transformers or your "
        "own GGUF)",
    ),
    engine: str | None = typer.Option(
        None,
        help="the engine the run will use: llama_cpp (default) | openai | "
        "transformers (engine.kind); decides --llm-operators",
    ),
    model: str | None = typer.Option(
        None, help="engine.model, as given to optimize (a GGUF of your own is taken as instruction-tuned)"
    ),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="a run file: the plan is for its engine section (and its dp.llm_operators)"
    ),
    dataset_size: int | None = typer.Option(
        None,
        help="the public N you declare; without it the run spends --size-epsilon-share of epsilon on a DP "
        "count of N first, and this plan includes it",
    ),
    size_epsilon_share: float = typer.Option(0.05, help="share of epsilon for the DP count of N (N not declared)"),
    labelling_queries: int | None = typer.Option(
        None,
        help="plan a labelling phase (dp.labelling) that gives DP labels to this many public inputs "
        "(default: the run file's dp.labelling, its queries resolved from task.public_inputs)",
    ),
    labelling_share: float | None = typer.Option(
        None, help="share of epsilon the labelling phase is calibrated to (dp.labelling.epsilon_share; default 0.5)"
    ),
    labelling_teachers: int | None = typer.Option(
        None, help="teachers of the labelling phase (default: N / 20 between 10 and 100, from --dataset-size)"
    ),
) -> None:
    """Calibration calculator: the noise for a budget, or the epsilon of a given noise. Reads no data."""
    try:
        from dp_textgrad.dp_es.plan import RunPlan
        from dp_textgrad.privacy.accounting import default_accountants
        from dp_textgrad.settings import supports_feedback

        if epsilon is None and noise_multiplier is None and selection_epsilon is None:
            raise ValueError(
                "budget: give --epsilon EPS for the noise that budget buys (e.g. dp-textgrad budget "
                "--epsilon 4), or --noise-multiplier Z (--selection-epsilon E0 for exponential and "
                "permute_and_flip) for the epsilon that noise costs"
            )
        if (epsilon is None) == (noise_multiplier is None and selection_epsilon is None):
            raise ValueError(
                "give either --epsilon (to calibrate) or --noise-multiplier/--selection-epsilon (to account), not both"
            )
        if llm_operators is None:  # as optimize decides it: from the engine the run will use
            llm_operators = _planned_llm_operators(config, engine, model)
        for name, value in (("noise_multiplier", noise_multiplier), ("selection_epsilon", selection_epsilon)):
            if value is not None and (not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name}: must be a finite number > 0, got {value}")
        if feedback is None:
            feedback = "dp_confusion" if supports_feedback(selection) else "none"
        labelling = _planned_labelling(
            config, labelling_queries, labelling_share, labelling_teachers, dataset_size, epsilon is not None
        )
        dp = config_from(
            dict(
                epsilon=epsilon if epsilon is not None else 1.0,
                delta=delta,
                generations=generations,
                population=population,
                parents=parents,
                sampling_rate=sampling_rate,
                selection=selection,
                feedback=feedback,
                llm_operators=llm_operators,
                dataset_size=dataset_size,
                size_epsilon_share=size_epsilon_share,
                labelling=labelling,
            )
        )
        # The strategy says which parameter the budget decides: a noise multiplier or a per-pick epsilon0.
        parameter = RunPlan(dp, None).strategy.calibrates
        if epsilon is not None:
            plan = RunPlan.calibrated(dp)
            what = (
                f"noise multiplier z = {plan.value:.4f}"
                if parameter == "noise_multiplier"
                else f"epsilon0 = {plan.value:.5f} per selection"
            )
            console.print(f"For epsilon = {epsilon}, delta = {delta:g}: {what}")
        else:
            field, value = (
                ("noise_multiplier", noise_multiplier)
                if parameter == "noise_multiplier"
                else ("selection_epsilon", selection_epsilon)
            )
            if value is None:
                raise ValueError(f"{field}: selection {dp.selection} is accounted from --{field.replace('_', '-')}")
            plan = RunPlan.with_value(dp, value)
            if plan.size_count is not None:  # the count takes a share of the budget that this noise implies
                search = min(plan.epsilons(delta, default_accountants()).values()) - dp.size_epsilon
                total = search / (1.0 - dp.size_epsilon_share)
                plan = RunPlan.with_value(dp.model_copy(update={"epsilon": total}), value)
                dp = plan.config
        if plan.size_count is not None:  # the run's stage 1 (docs/privacy.md, "The dataset size")
            console.print(
                f"N not declared: a DP count of N (discrete Laplace, pure DP) spends epsilon "
                f"{dp.size_epsilon:.4g} first; the search is calibrated to the remaining "
                f"{dp.search_epsilon:.4g}, and the two add up (basic composition)"
            )
        if labelling is not None:
            _print_labelling(plan, delta)
        console.print("epsilon of the whole run under each accountant:")
        values = plan.epsilons(delta, default_accountants())
        for name, value in values.items():
            console.print(f"  {name:>10}: {value:.4f}")
        console.print(f"  {'used':>10}: {min(values.values()):.4f} (smallest valid bound)")
    except typer.Exit:
        raise
    except bad_input_types() as exc:
        fail(exc, EXIT_BAD_INPUT)


def _planned_labelling(
    config: Path | None,
    queries: int | None,
    share: float | None,
    teachers: int | None,
    dataset_size: int | None,
    calibrating: bool,
):
    """The labelling phase the run will have, resolved from public values only, or None.

    The flags override the run file's ``dp.labelling``; its queries default to the number of
    public inputs of the run file's task (``task.public_inputs``, a public file, or a built-in
    task's ``options.public_inputs``), its teachers to the declared N's default. No private
    record is read.
    """
    from dp_textgrad.dp_es.config import ConfigError, LabellingConfig
    from dp_textgrad.settings import build_settings, read_config_file

    given = {k: v for k, v in (("queries", queries), ("epsilon_share", share), ("teachers", teachers)) if v is not None}
    raw = read_config_file(config) if config is not None else {}
    dp = raw.get("dp")
    if not given and not (isinstance(dp, dict) and dp.get("labelling") is not None):
        return None  # no labelling phase: the run file's task is not read
    settings = build_settings(raw, {}, source=config) if config is not None else None
    declared = settings.dp.labelling if settings is not None else None
    if declared is None and not given:
        return None
    if declared is None and queries is None:
        raise ValueError(
            "--labelling-queries: a labelling phase needs the number of public inputs to label (or a run file "
            "with dp.labelling and task.public_inputs: --config)"
        )
    if not calibrating:
        raise ValueError(
            "--labelling-queries: the labelling phase is calibrated to its share of --epsilon; give --epsilon "
            "(not --noise-multiplier/--selection-epsilon) to plan it"
        )
    try:
        base = declared if declared is not None else LabellingConfig()
        labelling = LabellingConfig.model_validate({**base.model_dump(), **given})
    except ValidationError as exc:
        problems = [
            f"dp.labelling.{'.'.join(str(x) for x in item.get('loc', ()))}: "
            + str(item.get("msg", "invalid value")).removeprefix("Value error, ")
            for item in exc.errors()
        ]
        raise ConfigError("; ".join(problems)) from None
    pool = settings.task.public_input_count() if settings is not None else None
    if labelling.queries is None:
        assert settings is not None  # (no run file: --labelling-queries was required above)
        resolved = labelling.resolved(pool or 0, dataset_size or 0)
        labelling = labelling.model_copy(update={"queries": resolved.queries})
    elif pool is not None:
        labelling.resolved(pool, dataset_size or 0)  # its check: no more queries than public inputs
    if labelling.teachers is None and dataset_size is not None:
        labelling = labelling.resolved(labelling.queries or 0, dataset_size)
    return labelling


def _print_labelling(plan, delta: float) -> None:
    """The labelling phase's line: its mechanism, queries, teachers and its own epsilon."""
    settings = plan.config.labelling
    sigma = plan.labelling_sigma
    alone = plan.labelling_epsilons(delta)
    threshold = (
        f"confident GNMax (threshold {settings.threshold:g} votes, threshold noise {settings.threshold_sigma:g})"
        if settings.threshold is not None
        else "GNMax"
    )
    teachers = (
        f"{settings.teachers} teachers"
        if settings.teachers is not None
        else "teachers from the DP count of N (N / 20, between 10 and 100)"
    )
    console.print(
        f"Labelling phase (before the search): {threshold}, vote noise sigma = {sigma:.4g} votes, "
        f"{settings.queries} public inputs (queries), {teachers}, up to {settings.max_demos} demonstrations "
        f"each; its own epsilon {min(alone.values()):.4g} (share {settings.epsilon_share:g} of epsilon, "
        "smallest accountant); the search is calibrated so that labelling and search composed fit the rest"
    )
    from dp_textgrad.dp_es.labelling_phase import noise_warning

    warning = noise_warning(sigma, settings.teachers)
    if warning is not None:
        console.print(f"[yellow]Warning[/]: {warning}.")


def _planned_llm_operators(config: Path | None, engine: str | None, model: str | None) -> bool:
    """``llm_operators`` of a run with this engine, decided from its section without loading the model."""
    from dp_textgrad.dp_es.plan import decide_llm_operators
    from dp_textgrad.settings import build_settings, read_config_file

    raw = read_config_file(config) if config is not None else {}
    raw.pop("task", None)  # the plan reads no data: a run file's task section does not matter here
    if isinstance(raw.get("dp"), dict):  # nor its labelling phase (_planned_labelling reads it with the task)
        raw["dp"] = {k: v for k, v in raw["dp"].items() if k != "labelling"}
    settings = build_settings(raw, {"engine": dict(kind=engine, model=model)}, source=config)
    return decide_llm_operators(settings.dp.llm_operators, settings.engine.follows_instructions())


def ledger(
    config: Path | None = typer.Option(None, "--config", "-c", help="the run's config file (its task section)"),
    task: str | None = typer.Option(None, help="built-in task: support | sst2 | banking77 (task.name)"),
    train: Path | None = typer.Option(
        None,
        "--dataset",
        "--train",
        help="the private training file (as given to optimize --train), or a declared dataset key",
    ),
    dataset_key: str | None = typer.Option(
        None, "--dataset-key", help="a dataset key declared with optimize --dataset-key (output.dataset_key)"
    ),
    runs_root: Path = typer.Option(Path("runs"), help="runs root whose lifetime store is read"),
    store: Path | None = typer.Option(None, help="lifetime store (default RUNS_ROOT/operator/lifetime_budget.sqlite)"),
    delta: float | None = typer.Option(
        None, help="delta of the composed total (default: the dataset's lifetime delta)"
    ),
    all_datasets: bool = typer.Option(False, "--all", help="every dataset in the store (no data needed)"),
    text_column: str = typer.Option("text", help="--dataset: the text column"),
    label_column: str = typer.Option("label", help="--dataset: the label column"),
    encoding: str = typer.Option("utf-8-sig", help="--dataset: the file's encoding"),
) -> None:
    """The lifetime budget of a dataset: its runs and the composed epsilon of all their charges."""

    try:
        from dp_textgrad.lifetime_link import describe_dataset
        from dp_textgrad.privacy.accounting.lifetime import LifetimeBudget
        from dp_textgrad.runs import lifetime_store
        from dp_textgrad.settings import build_settings, read_config_file

        # Where the store would be, worked out without LifetimeOptions.store_path: that makes the
        # operator folder, and looking must create nothing.
        path = store if store is not None else lifetime_store(runs_root)
        if not path.is_file():
            raise FileNotFoundError(
                f"store: no lifetime store yet at {path}; the first run under --runs-root "
                f"{runs_root} creates it there (or pass --store FILE)"
            )
        the_store = LifetimeBudget(path)
        if all_datasets:
            if config is not None or task is not None or train is not None or dataset_key is not None:
                raise ValueError(
                    "--all: lists every dataset; do not also give --config, --task, --dataset or --dataset-key"
                )
            datasets = the_store.datasets()
        elif dataset_key is not None:
            if config is not None or task is not None or train is not None:
                raise ValueError("--dataset-key: names the dataset; do not also give --config, --task or --dataset")
            datasets = [the_store.declared_key(dataset_key)]
        elif train is not None and config is None and task is None and not train.is_file():
            # Not a file: a dataset key the owner declared (public), if the store knows it.
            key = the_store.find_declared(str(train))
            if key is None:
                raise FileNotFoundError(
                    f"--dataset: {train} is neither a file nor a dataset key with runs in "
                    f"{path}; give the training file or the key passed to optimize "
                    "--dataset-key"
                )
            datasets = [key]
        elif train is not None and config is None and task is None:
            from dp_textgrad.privacy.data import PrivateDataset
            from dp_textgrad.tasks.loaders import load_classification_file

            records = load_classification_file(
                train, text_column, label_column, warn_imbalance=False, encoding=encoding
            )
            datasets = [the_store.fingerprint(PrivateDataset(records))]
        else:
            raw = read_config_file(config) if config is not None else {}
            settings = build_settings(raw, {"task": dict(name=task)}, source=config)
            if settings.output.dataset_key is not None:  # the run file names its dataset: no data read
                datasets = [the_store.declared_key(settings.output.dataset_key)]
            else:
                datasets = [the_store.fingerprint(settings.task.private_records())]
        if not datasets:
            console.print(f"No runs recorded in {path}.")
        for number, dataset in enumerate(datasets, start=1):
            for line in describe_dataset(the_store, dataset, number if all_datasets else None, delta):
                console.print(line, highlight=False, soft_wrap=True, markup=False)
    except typer.Exit:
        raise
    except bad_input_types() as exc:
        fail(exc, EXIT_BAD_INPUT)
