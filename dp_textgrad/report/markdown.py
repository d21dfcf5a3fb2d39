"""The report as Markdown, built from a run's released files only.

Sources: ``config.json`` (public parameters), ``result.json`` and ``metrics.jsonl``
(DP-released values and public costs), ``audit.json``. What each field may show is fixed
by :mod:`dp_textgrad.privacy.release`; nothing here reads the operator folder.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dp_textgrad import _io, runs
from dp_textgrad.dp_es.selector import SELECTION_STRATEGIES
from dp_textgrad.report.audit_section import audit_markdown
from dp_textgrad.report.fmt import INTERVAL_LABELS, eps, interval, metric_label, num, p_value, sig, signed
from dp_textgrad.report.plots import Z95, evaluation_intervals

UNSAFE_BANNER = (
    "**WARNING: unsafe mode: raw private records reached the mutator. This run is NOT "
    "differentially private; never ship its prompt.**"
)
BASELINE_BANNER = (
    "**Non-private baseline (`privacy: off`): exact scores, no noise, no differential-privacy "
    "guarantee. It is here to compare against; do not ship it as private.**"
)
FEWSHOT_BANNER = (
    "**WARNING: few-shot positive control: no optimisation; the released prompt is the seed prompt "
    "plus raw private records. It is NOT differentially private.**"
)


def run_kind(config: dict[str, Any], result: dict[str, Any]) -> str:
    """'dp', 'baseline' (privacy off), 'unsafe' or 'fewshot'."""
    if config.get("fewshot"):
        return "fewshot"
    if result.get("unsafe"):
        return "baseline" if config.get("config", {}).get("privacy") == "off" else "unsafe"
    return "dp"


def _used_bound(result: dict[str, Any]) -> str:
    epsilons = result.get("epsilons") or {}
    finite = {k: v for k, v in epsilons.items() if v is not None and v == v and v != float("inf")}
    return min(finite, key=finite.__getitem__) if finite else "-"


def _feedback_name(result: dict[str, Any] | None, config: dict[str, Any] | None = None) -> str:
    """What the DP feedback counts are: a classification task's confusion matrix, or a generation
    task's failure histogram (config.json's task_kind; for runs written before it, the evaluation's
    metric; without either, the classic name)."""
    kind = (config or {}).get("task_kind")
    if kind is not None:
        return "failure-histogram" if kind == "generate" else "confusion-matrix"
    metric = ((result or {}).get("evaluation") or {}).get("metric")
    return "failure-histogram" if metric not in (None, "accuracy") else "confusion-matrix"


def charged_parts(run_dir: Path) -> set[str]:
    """What the run's ledger charged besides the scores: ``feedback`` (a DP confusion matrix or
    failure histogram) and ``errors`` (the count of failed records). Read from the released
    ledger, so the report describes only mechanisms that ran (a run may plan feedback and never
    charge it: no LLM operator read it)."""
    parts: set[str] = set()
    path = runs.RunDir(run_dir).ledger
    if not path.is_file():
        return parts
    for entry in list(_io.read_jsonl(path))[1:]:
        metadata = entry.get("metadata") or {}
        if metadata.get("feedback_candidates"):
            parts.add("feedback")
        if metadata.get("error_noise_multiplier"):
            parts.add("errors")
    return parts


def _mechanism(config: dict[str, Any], result: dict[str, Any] | None = None, charged: set[str] | None = None) -> str:
    cfg = config.get("config", {})
    strategy = SELECTION_STRATEGIES.get(cfg.get("selection"))
    if strategy is None:
        return str(cfg.get("selection"))
    value = config.get("selection_epsilon" if strategy.calibrates == "epsilon0" else "noise_multiplier")
    text = strategy.describe(float(value), int(cfg.get("parents") or 1)) if value is not None else strategy.name
    if "feedback" in (charged or set()):
        text += f"; DP {_feedback_name(result, config)} feedback at {sig(cfg.get('feedback_noise_ratio'))} x that noise"
    if "errors" in (charged or set()):
        share = sig(cfg.get("max_error_share"))
        text += f"; the noisy count of records that failed to score (stop above max_error_share {share})"
    fresh = (result or {}).get("final_estimate")
    if fresh:
        text += (
            f"; then one Gaussian estimate of the released prompt's mean score on a fresh Poisson subsample "
            f"(rate {sig(fresh.get('sampling_rate'))}, noise std {sig(fresh.get('noise_std'))} on the mean)"
        )
    return text


def _schedule(config: dict[str, Any]) -> str:
    cfg = config.get("config", {})
    q = cfg.get("sampling_rate")
    size = config.get("dataset_size") or cfg.get("dataset_size") or cfg.get("counted_dataset_size")
    counted = cfg.get("dataset_size") is None and cfg.get("counted_dataset_size") is not None
    shown = f"{size}, a DP count," if counted else f"{size}"
    expected = f" (about {float(q) * int(size):.0f} of N = {shown} records per generation)" if q and size else ""
    return (
        f"{cfg.get('generations')} generations, population {cfg.get('population')}, "
        f"{cfg.get('parents')} parents, Poisson sampling rate q = {sig(q)}{expected}"
    )


def header(run_dir: Path, config: dict[str, Any], result: dict[str, Any]) -> list[str]:
    """Title, banner and the quotable guarantee."""
    kind = run_kind(config, result)
    cfg = config.get("config", {})
    lines = [f"# dp-textgrad report: run `{run_dir.name}`", ""]
    banner = {"unsafe": UNSAFE_BANNER, "baseline": BASELINE_BANNER, "fewshot": FEWSHOT_BANNER}.get(kind)
    if banner:
        lines += [banner, ""]
    if kind == "fewshot":
        fewshot = config["fewshot"]
        return lines + [
            "## Guarantee",
            "",
            "- none: NOT differentially private (few-shot positive control)",
            f"- no optimisation: the seed prompt plus {fewshot.get('n_demos')} raw private records drawn "
            f"at random (seed {fewshot.get('seed')}), what a naive few-shot prompt builder ships",
            "",
        ]
    task = f"task `{config.get('task', '-')}`, engine `{config.get('engine', '-')}`"
    charged = charged_parts(run_dir)
    if kind == "dp":
        lines += [
            f"> **({eps(result['epsilon'])}, {sig(result['delta'])})-differential privacy** for each "
            f"record of the private set (neighbours: add or remove one record), covering everything this "
            f"run released; bound: {_used_bound(result).upper()}, the smallest of "
            f"{len(result.get('epsilons') or {})} valid accountants. {_mechanism(config, result, charged)}; "
            f"{_schedule(config)}.",
            "",
        ]
    lines += ["## Guarantee", "", "| | |", "|---|---|"]
    if kind == "dp":
        lines += [
            f"| epsilon spent | **{eps(result['epsilon'])}** of a budget of {sig(cfg.get('epsilon'), 4)} |",
            f"| delta | {sig(result['delta'])} |",
            f"| accountant used | {_used_bound(result)} (every accountant's bound is listed below) |",
        ]
    else:
        lines += ["| epsilon | none: not differentially private |"]
    lines += [
        "| unit of privacy | one record; neighbouring datasets differ by adding or removing one record |",
        f"| mechanism | {_mechanism(config, result, charged) if kind == 'dp' else 'none (exact scores)'} |",
        f"| schedule | {_schedule(config)} |",
        f"| noise source | {result.get('noise') or config.get('noise') or 'OS entropy'} |",
        f"| run | {task}; stopped because: {result.get('stopped_because')} |",
        "",
    ]
    return lines


def expected_maximum(count: int) -> float:
    """E[max of ``count`` independent standard normals]: how far the largest of K equal candidates'
    noisy estimates lies above their common value, in noise standard deviations."""
    if count < 2:
        return 0.0
    from scipy import integrate, stats

    value, _ = integrate.quad(lambda t: t * count * stats.norm.pdf(t) * stats.norm.cdf(t) ** (count - 1), -12, 12)
    return float(value)


def released(result: dict[str, Any], config: dict[str, Any] | None = None) -> list[str]:
    """The released prompt and its DP estimate, saying what the estimate's interval covers: the
    noise, the subsampling (a public bound from q and N), and the winner's curse of a best-of-K."""
    lines = ["## Released prompt", "", "```text", result["prompt"], "```", ""]
    estimate = result.get("estimate")
    if estimate is None:
        return lines + fresh_estimate(result) + ([""] if result.get("final_estimate") else [])
    evaluations = (result.get("lineage") or [{}])[0].get("evaluations") or []
    noise_std = evaluations[-1].get("noise_std") if evaluations else None
    if not noise_std:
        return lines + [f"Score estimate: **{num(estimate)}**."] + fresh_estimate(result) + [""]
    cfg = (config or {}).get("config", {})
    size = (config or {}).get("dataset_size") or cfg.get("dataset_size") or cfg.get("counted_dataset_size")
    q = cfg.get("sampling_rate")
    half = Z95 * float(noise_std)
    lines.append(
        f"DP estimate of its score: **{num(estimate)}** (95% noise interval {num(estimate - half)} to "
        f"{num(estimate + half)}; noise std {sig(noise_std)}; shrunk toward the population mean, a DP output like "
        "every value in this report)."
    )
    if isinstance(q, (int, float)) and size:
        # Poisson subsample over the public q N: variance sum s_i^2 (1 - q) / (q N)^2 <= (1 - q) / (q N)
        # for scores in [0, 1] (a public bound; the realised spread is private).
        sampling = math.sqrt(max(0.0, 1.0 - float(q)) / (float(q) * float(size)))
        both = Z95 * math.hypot(float(noise_std), sampling)
        lines.append(
            f"With the subsampling as well (each generation scores about {float(q) * float(size):.0f} of N = "
            f"{size} records; at most {sig(sampling)} std), the 95% interval is {num(estimate - both)} to "
            f"{num(estimate + both)}."
        )
    fresh = result.get("final_estimate")
    population = int(cfg.get("population") or 0)
    if population >= 2:
        bias = expected_maximum(population) * float(noise_std)
        unbiased = (
            "The fresh estimate below has no such bias."
            if fresh
            else "For an unbiased figure, plan `dp.final_estimate`, or score the prompt on public test data "
            "(`dp-textgrad evaluate`)."
        )
        lines.append(
            f"Winner's curse: this prompt was released because its estimate was the best of {population} noisy "
            f"estimates, and the best of {population} equal candidates' estimates overstates their score by "
            f"{sig(bias)} on average ({expected_maximum(population):.2f} noise std); the shrinkage takes back "
            f"part of it. {unbiased}"
        )
    return lines + fresh_estimate(result) + [""]


def fresh_estimate(result: dict[str, Any]) -> list[str]:
    """The fresh DP estimate of the released prompt (``dp.final_estimate``), if the run made one."""
    fresh = result.get("final_estimate")
    if not fresh:
        return []
    low, high = fresh["interval"]
    return [
        f"Fresh DP estimate (`dp.final_estimate`): **{num(fresh['estimate'])}** (95% interval {num(low)} to "
        f"{num(high)}: noise std {sig(fresh['noise_std'])} and subsampling at most "
        f"{sig(fresh['sampling_std_bound'])}). Neither its subsample nor its noise chose the prompt, so it "
        "carries no winner's curse; it scores the private set, not new data."
    ]


def _cell(text: Any, limit: int = 120) -> str:
    """One table cell of free text: one line, no column separator, at most ``limit`` characters."""
    flat = " ".join(str(text).split()).replace("|", "/")
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _voting_mechanism(labelling: dict[str, Any]) -> str:
    sigma = f"vote noise sigma = {sig(labelling.get('sigma'))} votes"
    if labelling.get("mechanism") == "token_gnmax" and labelling.get("vote") == "span":
        return (
            f"GNMax over the public input's spans (at most {labelling.get('max_answer_tokens')} tokens): {sigma}; "
            f"one vote per demonstration; each demonstration's teachers split a "
            f"{sig(labelling.get('sampling_rate'))} Poisson subsample"
        )
    if labelling.get("mechanism") == "token_gnmax":
        return (
            f"GNMax per token over public candidates: {sigma}; at most {labelling.get('max_tokens')} tokens per "
            f"demonstration, every one charged; each demonstration's teachers split a "
            f"{sig(labelling.get('sampling_rate'))} Poisson subsample"
        )
    if labelling.get("mechanism") == "confident_gnmax":
        return (
            f"confident GNMax: {sigma}; answers only where the noisy top count reaches "
            f"{sig(labelling.get('threshold'))} votes (threshold noise sigma {sig(labelling.get('threshold_sigma'))})"
        )
    return f"GNMax (Gaussian noisy argmax): {sigma}"


def labelled_demonstrations(result: dict[str, Any]) -> list[str]:
    """The labelling phase (``result["labelling"]``): its release and the examples it labelled
    (a classification task's DP labels, or a generation task's DP answers voted token by token)."""
    labelling = result.get("labelling")
    if not labelling:
        return []
    examples = labelling.get("examples") or []
    teachers, demos, queries = labelling.get("teachers"), labelling.get("max_demos"), labelling.get("queries")
    if labelling.get("mechanism") == "token_gnmax":
        synthetic, spans = "synthetic_inputs" in labelling, labelling.get("vote") == "span"
        title, phase, field, column = "## DP-answered demonstrations", "answering", "reference", "DP answer"
        if synthetic:
            asked = f"generated {queries} demonstrations whole, input then answer, one token at a time"
        elif spans:
            asked = f"answered {queries} public unlabelled inputs, each by one vote over the input's spans"
        else:
            asked = f"answered {queries} public unlabelled inputs, one token at a time"
        released_unit = "Each answer" if spans else "Each token"
        how = (
            "the groups are disjoint (a keyed hash of the record) within a fresh subsample per demonstration, so "
            f"one record changes one teacher's votes. {released_unit} was the noisy argmax of the teachers' votes over "
            "candidates computed from public values only"
        )
        released = (
            "The generated inputs and their answers are" if synthetic else "The inputs are public; the answers are"
        )
        unit, nothing = "", "No demonstration was answered: the search ran without DP demonstrations."
    else:
        title, phase, field, column = "## DP-labelled demonstrations", "labelling", "label", "DP label"
        asked = f"voted a label for each of {queries} public unlabelled inputs"
        how = (
            "the groups are disjoint (a keyed hash of the record), so one record changes one teacher's votes. The "
            "vote counts were released through the noisy mechanism below"
        )
        released = "The inputs are public; the labels, and which and how many inputs were answered, are"
        unit, nothing = " public inputs", "No input was answered: the search ran without DP-labelled demonstrations."
    lines = [
        title,
        "",
        f"Before the search, {teachers} teachers {asked}. Each teacher is the task's prompt with up to {demos} "
        f"records of its own group as demonstrations; {how}, and the answered inputs joined the public "
        f"demonstrations of the search. **{released} DP outputs** covered by the guarantee above.",
        "",
        "| | |",
        "|---|---|",
        f"| answered | **{labelling.get('answered')} of {queries}**{unit} |",
        f"| teachers | {teachers} (up to {demos} demonstrations each) |",
        f"| mechanism | {_voting_mechanism(labelling)} |",
        f"| {phase} epsilon | {eps(labelling.get('epsilon'))} alone (calibrated to a share of "
        f"{sig(labelling.get('epsilon_share'))} of the budget); composed with the search into the total above |",
        "",
    ]
    if not examples:
        return [*lines, nothing, ""]
    lines += [f"| # | {'public input' if field == 'label' else 'input'} | {column} |", "|---|---|---|"]
    lines += [
        f"| {number} | {_cell(example.get('text', ''))} | {_cell(example.get(field, ''), 60)} |"
        for number, example in enumerate(examples, start=1)
    ]
    return [*lines, ""]


def evaluation(result: dict[str, Any], image: str | None) -> list[str]:
    ev = result.get("evaluation")
    if not ev:
        return []
    n = int(ev["n_test"])
    metric = metric_label(ev.get("metric"))
    binary = (ev.get("interval") or "wilson") == "wilson"
    method = INTERVAL_LABELS.get(str(ev.get("interval") or "wilson"), "Wilson")
    rows = []
    for name, key, (low, high) in zip(
        ("seed", "released"), ("seed_accuracy", "released_accuracy"), evaluation_intervals(ev), strict=True
    ):
        rows.append(f"| {name} | {interval(ev[key], low, high)} |")
    lines = [
        "## Test-split evaluation (outside the guarantee)",
        "",
        "The test split is the user's own held-out data, scored without noise: research only, not covered "
        "by the guarantee above.",
        "",
        f"| prompt | {metric}, n = {n} [95% {method} interval] |",
        "|---|---|",
        *rows,
        "",
    ]
    if ev.get("difference") is not None and binary:
        better, worse = ev.get("discordant") or (0, 0)
        lines += [
            f"Paired on the same {n} records: difference **{signed(ev['difference'])}** (95% CI "
            f"{signed(ev['difference_low'])} to {signed(ev['difference_high'])}); exact McNemar test "
            f"{p_value(ev['mcnemar_p'])} ({better} records only the released prompt gets right, "
            f"{worse} only the seed).",
            "",
        ]
    elif ev.get("difference") is not None:
        lines += [
            f"Paired on the same {n} records: difference in mean {metric} **{signed(ev['difference'])}** "
            f"(95% paired bootstrap interval {signed(ev['difference_low'])} to {signed(ev['difference_high'])}).",
            "",
        ]
    if image:
        lines += [f"![accuracy.png]({image})", ""]
    return lines


def privacy(metrics: list[dict[str, Any]], image: str | None) -> list[str]:
    if not metrics:
        return []
    names = sorted({k for m in metrics for k in m.get("epsilons", {})})
    lines = ["## Privacy spent per generation", ""]
    if image:
        lines += [f"![epsilon.png]({image})", ""]
    lines += [
        "Cumulative epsilon after each generation under every accountant (the ledger uses the smallest, in bold):",
        "",
        "| gen | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for m in metrics:
        values = m.get("epsilons", {})
        smallest = min((values[n] for n in names if n in values), default=None)
        cells = [
            f"**{eps(values[n])}**" if n in values and values[n] == smallest else eps(values.get(n)) for n in names
        ]
        lines.append(f"| {m['generation']} | " + " | ".join(cells) + " |")
    return lines + [""]


def generations(metrics: list[dict[str, Any]], image: str | None) -> list[str]:
    if not metrics:
        return []
    lines = ["## Scores per generation", ""]
    if image:
        lines += [f"![scores.png]({image})", ""]
    lines += [
        "| gen | best estimate [95% noise interval] | population mean | public calls | public tokens |",
        "|---|---|---|---|---|",
    ]
    for m in metrics:
        half = Z95 * float(m.get("noise_std_estimate") or 0.0)
        best = float(m["best_estimate"])
        tokens = int(m.get("public_prompt_tokens", 0)) + int(m.get("public_completion_tokens", 0))
        lines.append(
            f"| {m['generation']} | {interval(best, best - half, best + half)} | "
            f"{num(m['mean_estimate'])} | {m.get('public_calls', '-')} | {tokens:,} |"
        )
    return lines + [
        "",
        "Public costs are the mutation, critique and preflight calls, which see public text and DP "
        "outputs only. The private scoring phase's usage and time are functions of the secret "
        "subsample and are not shown (they stay in the run's operator/ folder).",
        "",
    ]


def lineage(result: dict[str, Any], image: str | None) -> list[str]:
    chain = result.get("lineage") or []
    if not chain:
        return []
    lines = ["## Lineage", ""]
    if image:
        lines += [f"![lineage.png]({image})", ""]
    lines += ["| gen | candidate | operator | parents | prompt |", "|---|---|---|---|---|"]
    for cand in sorted(chain, key=lambda c: (int(c.get("generation", 0)), str(c.get("id")))):
        text = " ".join(str(cand.get("text", "")).split()).replace("|", "/")
        text = text if len(text) <= 90 else text[:87] + "..."
        lines.append(
            f"| {cand.get('generation')} | `{cand.get('id')}` | {cand.get('operator')} | "
            f"{', '.join(cand.get('parent_ids') or []) or '-'} | {text} |"
        )
    return lines + [""]


def build_markdown(
    run_dir: Path,
    config: dict[str, Any],
    result: dict[str, Any],
    metrics: list[dict[str, Any]],
    images: dict[str, str],
    audit: dict[str, Any] | None = None,
) -> str:
    """The whole report; ``images`` maps a chart's name to the reference to embed."""
    lines = header(run_dir, config, result)
    lines += released(result, config)
    lines += labelled_demonstrations(result)
    lines += evaluation(result, images.get(runs.ACCURACY_PLOT_NAME))
    lines += privacy(metrics, images.get(runs.EPSILON_PLOT_NAME))
    lines += generations(metrics, images.get(runs.SCORES_PLOT_NAME))
    lines += lineage(result, images.get(runs.LINEAGE_PLOT_NAME))
    if audit is not None:
        lines += audit_markdown(audit, images.get(runs.AUDIT_ROC_PLOT_NAME))
    return "\n".join(lines)
