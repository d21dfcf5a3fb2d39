"""``dp-textgrad audit``: empirical privacy audits from the command line.

``dp-textgrad audit mechanisms --runs 5000`` runs the L1 mechanism audits (see
``run_mechanism_audits`` in :mod:`dp_textgrad.audit`), prints claimed epsilon vs empirical lower bound
vs the noise-off positive control, appends one JSON line per audit to
``<runs-dir>/run_metadata.jsonl`` and exits 1 when a lower bound exceeds its claim
(or, with ``--min-control``, when a positive control is too weak to have seen one).

``dp-textgrad audit canaries --mode dp|unsafe|fewshot`` runs one L2 end-to-end audit (see
``run_canary_audit`` in :mod:`dp_textgrad.audit`) on the built-in support task with the local
model: canaries in the private set, one optimisation run into ``<runs-dir>/run-*``,
attacks on the released prompt, ``audit.json`` and an audit section in the report.
It exits 1 when a DP run's lower bound exceeds the claimed epsilon (or a member's
secret is copied into a DP release), and, with ``--require-leak``, when a positive
control (``unsafe``, or ``fewshot``: no optimisation, the seed prompt plus ``--demos`` raw
private records; NOT private) shows no leak; 2 on bad input.
The audit names come from the package :mod:`dp_textgrad.audit` (its lazy exports), imported
when a command runs, so that the other commands never load scipy and scikit-learn.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from dp_textgrad.cli._console import EXIT_BAD_INPUT, EXIT_FAILURE
from dp_textgrad.cli.progress import epsilon_text

audit_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Empirical privacy audits (lower bounds on epsilon; they never prove privacy).",
)

EXIT_VIOLATION = EXIT_FAILURE  # a lower bound above its claim, or (--require-leak) a control without a leak


@audit_app.callback()
def _audit_callback() -> None:
    """Empirical privacy audits (lower bounds on epsilon; they never prove privacy)."""


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:.3f}"


@audit_app.command("mechanisms")
def mechanisms(
    runs: int = typer.Option(5000, "--runs", help="runs per arm for the Gaussian, exponential and top-k audits"),
    controller_runs: int = typer.Option(
        300, "--controller-runs", help="runs per arm for the whole controller loops (a few ms per run)"
    ),
    delta: float = typer.Option(1e-5, "--delta", help="delta at which claims and lower bounds are compared"),
    alpha: float = typer.Option(0.05, "--alpha", help="1 - confidence level of each lower bound"),
    seed: int = typer.Option(0, "--seed", help="seed of the audit's (reproducible, insecure) noise"),
    only: list[str] | None = typer.Option(
        None,
        "--only",
        help="run only these audits (repeatable): gaussian_scores, "
        "exponential, gumbel_top_k, controller_loop, "
        "controller_loop_exponential",
    ),
    min_control: float = typer.Option(
        0.0,
        "--min-control",
        help="also fail when a positive control's lower bound is below this (3.0 is reached at 1000 runs per arm)",
    ),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="where run_metadata.jsonl is appended"),
    log: bool = typer.Option(True, "--log/--no-log", help="append one JSON line per audit to the run log"),
) -> None:
    """L1 audits: claimed epsilon vs empirical lower bound vs noise-off positive control."""
    from dp_textgrad.audit import run_mechanism_audits
    from dp_textgrad.runs import append_run_log

    console = Console(width=max(Console().width, 110))  # the table needs ~100 columns
    started = time.perf_counter()
    try:
        results = run_mechanism_audits(runs, controller_runs, delta=delta, alpha=alpha, seed=seed, only=only)
    except ValueError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    table = Table(title=f"L1 mechanism audits (delta={delta:g}, alpha={alpha:g})")
    for column in ("audit", "q", "runs/arm", "claimed eps", "eps_lb", "noise-off eps_lb", "seconds", "verdict"):
        table.add_column(column)
    failed = False
    for result in results:
        weak = result.positive_control_eps_lb is not None and result.positive_control_eps_lb < min_control
        verdict = "VIOLATION" if result.violation else ("CONTROL TOO WEAK" if weak else "ok")
        failed = failed or result.violation or weak
        table.add_row(
            result.name,
            f"{result.sampling_rate:g}",
            str(result.runs_per_arm),
            _fmt(result.claimed_epsilon),
            _fmt(result.eps_lb),
            _fmt(result.positive_control_eps_lb),
            f"{result.seconds:.2f}",
            verdict,
        )
        if log:
            append_run_log(
                runs_dir,
                {
                    "kind": "audit_l1",
                    "audit": result.name,
                    "verdict": verdict,
                    "command": "audit mechanisms",
                    **result.to_dict(),
                },
                channel="audit_log",
            )
    console.print(table)
    console.print(
        f"total {time.perf_counter() - started:.1f} s; an eps_lb above the claim is a bug, "
        "an eps_lb below it proves nothing."
    )
    if failed:
        raise typer.Exit(EXIT_VIOLATION)


def _canary_engine(threads: int | None):
    """The engine of ``audit canaries``: the built-in local model, built as ``optimize`` builds its engine
    (tests replace ``EngineSection.build``). No ``--threads``: ``DP_TEXTGRAD_THREADS``, else the free CPUs."""
    from dp_textgrad.engines.llama_support import default_threads
    from dp_textgrad.settings import EngineSection

    return EngineSection(kind="llama_cpp", options={"n_threads": threads or default_threads()}).build()


def _bad_input(message: str) -> None:
    typer.echo(f"error: {' '.join(str(message).split())}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def _interval_text(interval: dict | None) -> str:
    return "-" if not interval else f"{interval['estimate']:.2f} [{interval['low']:.2f}, {interval['high']:.2f}]"


@audit_app.command("canaries")
def canaries(
    mode: str = typer.Option(
        "dp",
        "--mode",
        help="dp (the library's DP-ES), unsafe (positive control: raw "
        "private records reach the mutator; NOT private) or fewshot "
        "(positive control: no optimisation, the seed prompt plus "
        "--demos raw private records; NOT private)",
    ),
    demos: int = typer.Option(
        8,
        "--demos",
        help="fewshot mode: raw private records (members included, drawn at "
        "random by --seed) appended to the seed prompt; unused otherwise",
    ),
    n_canaries: int = typer.Option(32, "--canaries", help="canaries m; each is a member with probability 1/2"),
    n_records: int = typer.Option(32, "--records", help="canary-free private records the members are mixed into"),
    n_public: int = typer.Option(
        4,
        "--public",
        help="public examples of the built-in task (the mutator's demo "
        "pool besides, in unsafe mode, the private records shown)",
    ),
    unsafe_examples: int = typer.Option(
        0,
        "--unsafe-examples",
        help="unsafe mode: private records shown to the mutator (0: all of the "
        "audited private set, members included); unused in dp mode",
    ),
    epsilon: float = typer.Option(4.0, "--epsilon", help="privacy budget of the audited run"),
    generations: int = typer.Option(6, "--generations", help="DP generations of the audited run"),
    population: int = typer.Option(6, "--population", help="candidates per generation"),
    parents: int = typer.Option(2, "--parents", help="parents per generation"),
    sampling_rate: float = typer.Option(0.35, "--sampling-rate", help="Poisson sampling rate q of the run"),
    seed: int = typer.Option(
        0,
        "--seed",
        help="seed of the canaries, their inclusion bits, the task and the "
        "run's non-private choices (never of DP noise)",
    ),
    references: int = typer.Option(
        15, "--references", help="reference secrets per canary for exposure (resolution log2(n + 1) bits)"
    ),
    max_share: float = typer.Option(
        0.5,
        "--max-share",
        help="largest canary share of the private set allowed (an audit setting; the library default is 0.01)",
    ),
    alpha: float = typer.Option(0.05, "--alpha", help="1 - confidence level of the lower bound"),
    threads: int | None = typer.Option(
        None, "--threads", help="llama.cpp threads (default: DP_TEXTGRAD_THREADS, else the free CPUs)"
    ),
    runs_dir: Path = typer.Option(
        Path("runs"), "--runs-dir", help="where the run directory is created and run_metadata.jsonl is appended"
    ),
    save_canaries: Path | None = typer.Option(
        None,
        "--save-canaries",
        help="also save the canary file (it holds the secrets; keep it outside the run directory)",
    ),
    evaluate: bool = typer.Option(False, "--evaluate/--no-evaluate", help="also report test accuracy (slower)"),
    require_leak: bool = typer.Option(
        False, "--require-leak", help="unsafe/fewshot mode: exit 1 when the positive control shows no leak"
    ),
    log: bool = typer.Option(True, "--log/--no-log", help="append one JSON line to the run log"),
) -> None:
    """L2 audit: canaries through one real optimisation run, then attacks on the released prompt."""
    from pydantic import ValidationError

    from dp_textgrad.audit import CanaryAuditOptions, run_canary_audit
    from dp_textgrad.dp_es.config import DPESConfig

    if mode not in ("dp", "unsafe", "fewshot"):
        _bad_input(f"mode: use 'dp', 'unsafe' or 'fewshot', got {mode!r}")
    checks = (
        ("canaries", n_canaries, 1),
        ("records", n_records, 1),
        ("public", n_public, 1),
        ("references", references, 1),
        ("threads", 1 if threads is None else threads, 1),
        ("seed", seed, 0),
        ("unsafe-examples", unsafe_examples, 0),
        ("demos", demos, 1),
    )
    for name, value, minimum in checks:
        if value < minimum:
            _bad_input(f"--{name}: must be an integer >= {minimum}, got {value}")
    if n_records < n_canaries:
        _bad_input(
            f"--records: {n_canaries} canaries need at least {n_canaries} canary-free records to be spread "
            f"over, got {n_records}"
        )
    if mode == "fewshot" and demos > n_records:
        _bad_input(f"--demos: {demos} demonstrations need at least {demos} records, got --records {n_records}")
    try:
        # Same config in both modes; unsafe_examples only matters once run_canary_audit sets mode='unsafe'.
        # 0 means every record of the audited private set (at most n_records + n_canaries).
        config = DPESConfig(
            epsilon=epsilon,
            generations=generations,
            population=population,
            parents=parents,
            sampling_rate=sampling_rate,
            seed=seed,
            unsafe_examples=unsafe_examples or n_records + n_canaries,
        )
        options = CanaryAuditOptions(
            warn_share=max_share, max_share=max_share, n_exposure_references=references, alpha=alpha
        )
    except ValidationError as exc:
        from dp_textgrad.dp_es.config import format_validation_error

        _bad_input(format_validation_error(exc))
    except ValueError as exc:
        _bad_input(str(exc))

    from dp_textgrad.cli.progress import best_estimate_text
    from dp_textgrad.engines.base import EngineError
    from dp_textgrad.tasks.synthetic import generate_support_examples, make_support_task

    console = Console(width=max(Console().width, 120))
    try:
        task = make_support_task(seed=seed, n_private=1, n_public=n_public, n_test=50)
        # The auditor's own private records (the task's private set is replaced, never read).
        records = generate_support_examples(n_records, seed=10_000 + seed)
        console.print(f"L2 audit ({mode}): {n_canaries} canaries, {n_records} records; loading the engine...")
        if mode == "fewshot":
            console.print(
                f"fewshot mode, NOT private: no optimisation; the release is the seed prompt plus {demos} "
                "raw private records (a positive control)",
                markup=False,
                highlight=False,
            )
        engine = _canary_engine(threads)

        def progress(report) -> None:
            console.print(
                f"  generation {report.generation + 1}/{generations}: best estimate "
                f"{best_estimate_text(report)}, epsilon spent {epsilon_text(report.epsilon_spent, 3)}"
            )

        result = run_canary_audit(
            task,
            engine,
            config,
            records=records,
            n_canaries=n_canaries,
            seed=seed,
            mode=mode,
            options=options,
            runs_root=runs_dir,
            evaluate=evaluate,
            task_name="support (built-in, audit)",
            canary_path=save_canaries,
            on_generation=progress,
            log=log,
            n_demos=demos,
        )
    except typer.Exit:
        raise
    except (ValueError, FileNotFoundError) as exc:
        _bad_input(str(exc))
    except (EngineError, RuntimeError, OSError) as exc:
        typer.echo(f"error: {' '.join(str(exc).split()) or type(exc).__name__}", err=True)
        raise typer.Exit(EXIT_VIOLATION) from None

    audit = result.audit
    label = f"{mode}, NOT private" if mode == "fewshot" else mode
    table = Table(
        title=f"L2 canary audit ({label}): {audit['canaries']['n_members']} members, "
        f"{audit['canaries']['n_nonmembers']} non-members"
    )
    fpr = options.fprs[0]
    for column in (
        "attack",
        "ROC-AUC [95% CI]",
        "PR-AUC [95% CI]",
        f"TPR@{fpr:g} FPR",
        "Cohen's d",
        "one-run eps_lb",
        "GDP eps (estimate)",
    ):
        table.add_column(column)
    for name, attack in audit["attacks"].items():
        if not attack.get("available"):
            table.add_row(name, "unavailable", "", "", "", "", "")
        elif "auc" not in attack:
            table.add_row(name, "-", "-", "-", "-", _fmt(attack["one_run"]["epsilon"]), "-")
        else:
            tpr = attack["tpr_at_fpr"][0]["tpr"]
            table.add_row(
                name,
                _interval_text(attack["auc"]),
                _interval_text(attack["pr_auc"]),
                "n/a" if tpr is None else f"{tpr:.2f}",
                f"{attack['cohens_d']['estimate']:.2f} ({attack['magnitude']})",
                _fmt(attack["one_run"]["epsilon"]),
                _fmt(attack["gdp_estimate"]["epsilon"]),
            )
    console.print(table)
    leakage, claim = audit["leakage"], audit["claim"]
    claimed = (
        ("none (fewshot: NOT private)" if mode == "fewshot" else "none (unsafe mode)")
        if claim["epsilon"] is None
        else _fmt(claim["epsilon"])
    )
    gdp = audit["gdp_estimate"]
    ceiling = audit.get("eps_lb", {}).get("ceiling")
    console.print(
        f"claimed epsilon {claimed} (delta {claim['delta']:.2g}); eps_lb {_fmt(result.eps_lb)} "
        f"({1 - alpha:.0%} one-run lower bound; a perfect attack would show {_fmt(ceiling)}); "
        f"Gaussian-DP estimate {_fmt(gdp['epsilon']) if gdp else '-'} (not a bound)",
        markup=False,
        highlight=False,
    )
    console.print(
        f"secrets verbatim in the release: {leakage['prompt_text']['verbatim_members']} member(s), "
        f"{leakage['prompt_text']['verbatim_nonmembers']} non-member(s); extracted: "
        f"{leakage['extraction']['extracted_members']} member(s), "
        f"{leakage['extraction']['extracted_nonmembers']} non-member(s)",
        markup=False,
        highlight=False,
    )
    console.print(f"verdict: {result.verdict}", markup=False, highlight=False)
    console.print(
        f"run directory: {result.run_dir} (audit.json, report.md; wall times in operator/)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    shown = audit.get("settings", {}).get("fewshot", {}).get("member_canaries_shown")
    if shown is not None:
        console.print(
            f"member canaries among the {demos} raw demonstrations: {len(shown)} ({', '.join(shown)})",
            markup=False,
            highlight=False,
        )
    if result.violation or (mode in ("unsafe", "fewshot") and require_leak and not result.leak_detected):
        raise typer.Exit(EXIT_VIOLATION)
