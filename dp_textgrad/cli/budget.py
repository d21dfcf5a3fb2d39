"""``dp-textgrad budget``: the calibration calculator; ``dp-textgrad ledger``: a dataset's lifetime budget.

Neither reads private records for its numbers (``ledger`` reads a data file only to find its
fingerprint in the operator's store). Both import what they use when they run, so that
``dp-textgrad budget`` starts without the engines, TextGrad or the audits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError

import dp_textgrad.cli._run_file as run_file
from dp_textgrad.cli._console import EXIT_BAD_INPUT, bad_input_types, config_from, console, fail

# Without --config, the plan's settings where no flag gives them (with --config: the run file's, as optimize).
_BUDGET_DEFAULTS: dict[str, Any] = dict(
    delta=1e-5, generations=6, population=6, parents=2, sampling_rate=0.1, selection="gaussian"
)


def budget(
    epsilon: float | None = typer.Option(None, help="target epsilon: prints the calibrated noise"),
    delta: float | None = typer.Option(None, help="delta (default 1e-5; with --config the run file's)"),
    generations: int | None = typer.Option(None, help="DP generations T (default 6; with --config the run file's)"),
    population: int | None = typer.Option(None, help="candidates per generation K (default 6)"),
    parents: int | None = typer.Option(None, help="parents per generation k (default 2)"),
    sampling_rate: str | None = typer.Option(
        None,
        help="Poisson sampling rate q (default 0.1; with --config the run file's), or auto: the q that gives a "
        "candidate's mean score the least noise within --max-private-evaluations (needs N: --dataset-size)",
    ),
    max_private_evaluations: int | None = typer.Option(
        None, help="cap on the planned private record evaluations q N K T (dp.max_private_evaluations)"
    ),
    selection: str | None = typer.Option(None, help="gaussian | exponential | permute_and_flip (default gaussian)"),
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
        None,
        "--config",
        "-c",
        help="a run file: plans exactly what optimize --config runs (its dp section, engine and task; flags "
        "override them as optimize's do)",
    ),
    dataset_size: int | None = typer.Option(
        None,
        help="the public N you declare; without it the run spends --size-epsilon-share of epsilon on a DP "
        "count of N first, and this plan includes it (with --config: the run file's dp.dataset_size)",
    ),
    size_epsilon_share: float | None = typer.Option(
        None, help="share of epsilon for the DP count of N (N not declared; default 0.05)"
    ),
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
    margin: float = typer.Option(
        0.05, help="the lead (in mean score) at which to forecast how often the best candidate is ranked first"
    ),
) -> None:
    """Calibration calculator: the noise for a budget, or the epsilon of a given noise, and what the
    plan will cost and how well it can rank. Reads no data."""
    try:
        from dp_textgrad.dp_es.plan import RunPlan
        from dp_textgrad.privacy.accounting import default_accountants
        from dp_textgrad.privacy.accounting.bounds import format_epsilon

        if epsilon is None and noise_multiplier is None and selection_epsilon is None and config is None:
            raise ValueError(
                "budget: give --epsilon EPS for the noise that budget buys (e.g. dp-textgrad budget "
                "--epsilon 4), or --noise-multiplier Z (--selection-epsilon E0 for exponential and "
                "permute_and_flip) for the epsilon that noise costs, or --config RUN_FILE for its plan"
            )
        if epsilon is not None and (noise_multiplier is not None or selection_epsilon is not None):
            raise ValueError(
                "give either --epsilon (to calibrate) or --noise-multiplier/--selection-epsilon (to account), not both"
            )
        for name, value in (("noise_multiplier", noise_multiplier), ("selection_epsilon", selection_epsilon)):
            if value is not None and (not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name}: must be a finite number > 0, got {value}")
        calibrating = noise_multiplier is None and selection_epsilon is None
        flags = dict(
            epsilon=epsilon,
            delta=delta,
            generations=generations,
            population=population,
            parents=parents,
            sampling_rate=sampling_rate,
            max_private_evaluations=max_private_evaluations,
            selection=selection,
            feedback=feedback,
            llm_operators=llm_operators,
            size_epsilon_share=size_epsilon_share,
        )
        labelling = _planned_labelling(
            config, labelling_queries, labelling_share, labelling_teachers, dataset_size, calibrating
        )
        if config is not None:
            dp, max_new_tokens = _run_file_config(config, flags, engine, model, dataset_size, labelling)
        else:
            dp, max_new_tokens = _flag_config(flags, engine, model, dataset_size, labelling), None
        # The strategy says which parameter the budget decides: a noise multiplier or a per-pick epsilon0.
        parameter = RunPlan(dp, None).strategy.calibrates
        if parameter is None:
            raise ValueError("privacy: 'off' is a non-private baseline: it has no noise and no budget to plan")
        delta = dp.resolved_delta
        if calibrating:
            plan = RunPlan.calibrated(dp)
            what = (
                f"noise multiplier z = {plan.value:.4f}"
                if parameter == "noise_multiplier"
                else f"epsilon0 = {plan.value:.5f} per selection"
            )
            q_note = " (planned: sampling_rate auto)" if _was_auto(config, sampling_rate) else ""
            console.print(
                f"For epsilon = {dp.epsilon:g}, delta = {delta:g}: {what}; q = {dp.resolved_sampling_rate:.4g}{q_note}"
            )
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
        if dp.labelling is not None:
            _print_labelling(plan, delta)
        console.print("epsilon of the whole run under each accountant (rounded up):")
        values = plan.epsilons(delta, default_accountants())
        for name, value in values.items():
            console.print(f"  {name:>10}: {format_epsilon(value)}")
        console.print(f"  {'used':>10}: {format_epsilon(min(values.values()))} (smallest valid bound)")
        _print_forecast(plan, margin, max_new_tokens)
    except typer.Exit:
        raise
    except bad_input_types() as exc:
        fail(exc, EXIT_BAD_INPUT)


def _was_auto(config: Path | None, flag: str | None) -> bool:
    if flag is not None:
        return flag.strip().lower() == "auto"
    if config is None:
        return False
    from dp_textgrad.settings import read_config_file

    dp = read_config_file(config).get("dp")
    return isinstance(dp, dict) and str(dp.get("sampling_rate", "")).strip().lower() == "auto"


def _flag_config(flags: dict[str, Any], engine: str | None, model: str | None, dataset_size: int | None, labelling):
    """The plan's configuration from the flags alone (budget's own defaults for those not given)."""
    from dp_textgrad.dp_es.plan import resolve_sampling_rate
    from dp_textgrad.settings import supports_feedback

    given = {k: v for k, v in flags.items() if v is not None}
    settings = {**_BUDGET_DEFAULTS, **given}
    if settings.get("feedback") is None:
        settings["feedback"] = "dp_confusion" if supports_feedback(settings["selection"]) else "none"
    if settings.get("llm_operators") is None:  # as optimize decides it: from the engine the run will use
        settings["llm_operators"] = _planned_llm_operators(None, engine, model)
    settings.setdefault("epsilon", 1.0)  # accounting a given noise: the epsilon is computed, not read
    dp = config_from(dict(**settings, dataset_size=dataset_size, labelling=labelling))
    if dp.auto_sampling_rate and dataset_size is None:
        raise ValueError("--sampling-rate auto: plans q from N; give --dataset-size (the public N you will declare)")
    return resolve_sampling_rate(dp.resolved()) if dataset_size is not None else dp


def _run_file_config(
    config: Path, flags: dict[str, Any], engine: str | None, model: str | None, dataset_size: int | None, labelling
):
    """What ``optimize --config`` resolves before its first charge, from the same run file and flags:
    its dp section (flags override it), N, delta and q as the run fills them in, the engine's
    decision on LLM operators. Refuses, naming the field, what only the run itself can know (q
    from a DP count of N). Also the task's public cap on output tokens, where it generates."""
    from dp_textgrad.dp_es.config import DEFAULT_DELTA, ConfigError
    from dp_textgrad.dp_es.plan import decide_llm_operators, resolve_sampling_rate
    from dp_textgrad.settings import build_settings, read_config_file

    if dataset_size is not None:
        raise ValueError(
            "--dataset-size: with --config the run file decides N (dp.dataset_size, or a DP count); declare it "
            "there so that budget and optimize plan the same run"
        )
    raw = read_config_file(config)
    given = {k: v for k, v in flags.items() if v is not None and k != "llm_operators"}
    settings = build_settings(raw, {"dp": given, "engine": dict(kind=engine, model=model)}, source=config)
    dp = settings.dp
    declared = flags.get("llm_operators")
    dp = dp.model_copy(
        update={
            "llm_operators": decide_llm_operators(
                declared if declared is not None else dp.llm_operators, settings.engine.follows_instructions()
            ),
            "labelling": labelling,
        }
    )
    if dp.privacy == "off":
        raise ConfigError("privacy: 'off' is a non-private baseline: it has no noise and no budget to plan")
    if dp.dataset_size is None:
        if dp.sampling_rate is None or dp.auto_sampling_rate:
            what = "'auto'" if dp.auto_sampling_rate else "its default, min(1, 150 / N),"
            raise ConfigError(
                f"sampling_rate: {config.name} declares no dp.dataset_size, so the run's q ({what}) comes from "
                "the DP count of N it makes first, which no plan can know; declare dp.dataset_size (a public N), "
                "or give dp.sampling_rate a number (or --sampling-rate)"
            )
        dp = dp.model_copy(update={"delta": dp.delta if dp.delta is not None else DEFAULT_DELTA})
    else:
        dp = resolve_sampling_rate(dp.resolved())
    return dp, _answer_token_cap(settings)


def _print_forecast(plan, margin: float, max_new_tokens: int | None) -> None:
    """What the plan costs and how well it ranks, from public quantities only (docs/cli.md, budget)."""
    from dp_textgrad.dp_es.plan import (
        final_estimate_std,
        final_evaluations,
        mean_noise_std,
        ranking_probability,
        sampling_std_bound,
    )

    dp = plan.config
    size = dp.public_dataset_size
    q, k, t = dp.resolved_sampling_rate, dp.population, dp.generations
    if size is None:
        console.print(
            f"Per generation about q N = {q:.4g} N private records per candidate (N: the run's DP count); the "
            "noise on a mean score and the cost follow from N: declare dp.dataset_size to see them."
        )
        return
    noise = mean_noise_std(plan)
    sampling = sampling_std_bound(dp)
    console.print(
        f"Noise on one candidate's mean score (units of the clip bound): DP {noise:.4f}; with the subsampling "
        f"bound {sampling:.4f}, {math.hypot(noise, sampling):.4f} in all."
    )
    evaluations = q * size * k * t
    final = plan.final()
    extra = final_evaluations(plan)
    fresh = final_estimate_std(plan)
    rate = dp.final_estimate_rate
    if fresh is not None and rate is not None:
        console.print(
            f"Final estimate (dp.final_estimate): the released prompt re-scored on a fresh subsample of about "
            f"{rate * size:.0f} records (q = {rate:.4g}), noise std {fresh[0]:.4f} on its mean and subsampling at "
            f"most {fresh[1]:.4f}; calibrated alone to epsilon {dp.final_estimate.epsilon_share * dp.epsilon:.4g} "
            "(its share), composed with the search in the bounds above."
        )
    added = " + ".join(
        what for what, present in (("the final selection", final is not None), ("the final estimate", fresh)) if present
    )
    output = f"; {max_new_tokens} output tokens at most each" if max_new_tokens else ""
    console.print(
        f"Planned private work: about {q * size * k:.0f} record evaluations per generation, {evaluations + extra:.0f} "
        f"in all (q N K T{' + ' + added if added else ''}); each reads one private record of at most "
        f"{dp.max_record_tokens} tokens after a prompt of at most {dp.max_prompt_chars} characters{output}. "
        "The public phase (mutation, critiques) comes on top."
    )
    chance = ranking_probability(plan, margin)
    console.print(
        f"A candidate that leads the other {k - 1} by {margin:g} in mean score is ranked first in a generation "
        f"with probability {chance:.3f} (the others tied: the worst case at that lead)."
    )


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
    tokens = _answer_token_cap(settings)
    if dataset_size is None and settings is not None and tokens is not None:
        dataset_size = settings.dp.dataset_size  # a generation task's answers need N for their default rate
    if labelling.queries is None:
        assert settings is not None  # (no run file: --labelling-queries was required above)
        resolved = labelling.resolved(pool or 0, dataset_size or 0, generation_tokens=tokens)
        labelling = labelling.model_copy(update={"queries": resolved.queries})
    elif pool is not None:
        # its checks: no more queries than public inputs, and the keys fit the task's family
        labelling.resolved(pool, dataset_size or 0, generation_tokens=tokens)
    available = pool if pool is not None else (labelling.queries or 0)
    if dataset_size is not None:
        labelling = labelling.resolved(available, dataset_size, generation_tokens=tokens)
    elif tokens is not None and (labelling.teachers is None or labelling.sampling_rate is None):
        raise ConfigError(
            "dp.labelling.sampling_rate: a generation task's DP answers subsample the private records at a rate "
            "that defaults from N, and N is not declared; give --dataset-size (or dataset_size in the run file), or "
            "dp.labelling.teachers and dp.labelling.sampling_rate"
        )
    elif tokens is not None:
        labelling = labelling.resolved(available, 0, generation_tokens=tokens)
    return labelling


def _answer_token_cap(settings: Any) -> int | None:
    """The run file's generation task's ``max_new_tokens`` (a built-in task's without building it),
    or None for a classification task or without a run file."""
    if settings is None or settings.task.kind != "generate":
        return None
    if settings.task.name is not None:
        from dp_textgrad.tasks.registry import generation_token_cap

        return generation_token_cap(settings.task.name, settings.task.options)
    return int(settings.task.max_new_tokens)


def _print_labelling(plan, delta: float) -> None:
    """The labelling phase's line: its mechanism, queries, teachers and its own epsilon."""
    from dp_textgrad.dp_es.config import DEFAULT_TEACHER_DEMOS
    from dp_textgrad.privacy.accounting.bounds import format_epsilon

    settings = plan.config.labelling
    sigma = plan.labelling_sigma
    alone = plan.labelling_epsilons(delta)
    own = (
        f"its own epsilon {format_epsilon(min(alone.values()))} (share {settings.epsilon_share:g} of epsilon, "
        f"smallest accountant); the search is calibrated so that {'answers' if settings.answers else 'labelling'} "
        "and search composed fit the rest"
    )
    if settings.answers:
        from dp_textgrad.dp_es.labelling_phase import describe_answers

        console.print(
            f"Labelling phase (before the search): {describe_answers(settings)}; vote noise sigma = "
            f"{sigma:.4g} votes; {own}"
        )
    else:
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
            f"{settings.queries} public inputs (queries), {teachers}, up to "
            f"{settings.max_demos or DEFAULT_TEACHER_DEMOS} demonstrations each; {own}"
        )
    from dp_textgrad.dp_es.labelling_phase import noise_warning

    warning = noise_warning(sigma, settings.teachers)
    if warning is not None:
        console.print(f"[yellow]Warning[/]: {warning}.")


def _file_dataset(
    store, path: Path, classify_columns: tuple[str, str], generate_columns: tuple[str, str], encoding: str
) -> str:
    """The store's key for a private file given to ``optimize --train``: its records read as a
    classification file and as a generation file (a run fingerprints the records its task holds),
    the reading whose fingerprint has runs in the store, else the first that parses."""
    from dp_textgrad.privacy.data import PrivateDataset
    from dp_textgrad.tasks.generation_files import load_generation_file
    from dp_textgrad.tasks.loaders import load_classification_file

    readings: dict[str, Callable[[], Sequence[Any]]] = {
        f"a classification file (--text-column {classify_columns[0]!r}, --label-column {classify_columns[1]!r})": (
            lambda: load_classification_file(path, *classify_columns, warn_imbalance=False, encoding=encoding)
        ),
        f"a generation file (--input-column {generate_columns[0]!r}, --target-column {generate_columns[1]!r})": (
            lambda: load_generation_file(path, *generate_columns, encoding=encoding)
        ),
    }
    found: list[str] = []
    errors: list[str] = []
    for name, read in readings.items():
        try:
            found.append(store.fingerprint(PrivateDataset(read())))
        except ValueError as exc:
            errors.append(f"as {name}: {exc}")
    if not found:
        raise ValueError(f"--dataset: cannot read {path.name} " + "; ".join(errors))
    return next((key for key in found if store.runs(key)), found[0])


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
    task: str | None = typer.Option(None, help=run_file.TASK_HELP),
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
    text_column: str = typer.Option("text", help="--dataset: the text column (a classification file)"),
    label_column: str = typer.Option("label", help="--dataset: the label column (a classification file)"),
    input_column: str = typer.Option("input", help="--dataset: the input column (a generation file)"),
    target_column: str = typer.Option("target", help="--dataset: the target column (a generation file)"),
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
            datasets = [
                _file_dataset(the_store, train, (text_column, label_column), (input_column, target_column), encoding)
            ]
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
