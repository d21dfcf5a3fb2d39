"""The release boundary: every structured output of a run, field by field, in one table.

Each field of each channel has one class:

- ``public``: configuration, public parameters, and costs of the public phase (mutation
  and critique calls see only public text and DP outputs);
- ``dp_output``: released by a charged mechanism, or computed from such releases only
  (post-processing);
- ``operator_only``: derived from private data without noise (real usage, token counts
  and wall time of the private scoring phase). It never reaches a released channel; runs
  keep it under ``operator/`` in the run directory, which reports, ``result.json``,
  ``metrics.jsonl``, callbacks and the run log never read.

Writers do not pick fields themselves: they hand the whole payload to :func:`split`,
which returns the released part and the operator-only part and refuses a field the
table does not classify. So a new statistic cannot reach a file without a decision
here, and the twin-run test (``tests/dp_es/test_release_twin.py``) checks the table: flip an
operator-only field to ``public`` and the test fails.

``docs/privacy.md`` renders this table for readers (``python -m dp_textgrad.privacy.release``
prints it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PUBLIC = "public"
DP_OUTPUT = "dp_output"
OPERATOR_ONLY = "operator_only"
CLASSES = (PUBLIC, DP_OUTPUT, OPERATOR_ONLY)

# A field whose value is a list of payloads of another channel (e.g. history -> metrics).
NESTED = "nested:"


class UnclassifiedFieldError(KeyError):
    """A writer tried to release a field the release table does not classify."""

    def __str__(self) -> str:
        return str(self.args[0])


# channel -> field -> class (or "nested:<channel>"). Channel names are the places they go.
CHANNELS: dict[str, dict[str, str]] = {
    # One line per generation in metrics.jsonl; also the GenerationReport given to callbacks,
    # the progress display and the history in result.json and checkpoint.json.
    "metrics": {
        "generation": PUBLIC,
        "best_candidate_id": DP_OUTPUT,
        "best_estimate": DP_OUTPUT,
        "mean_estimate": DP_OUTPUT,
        "noise_std_estimate": DP_OUTPUT,  # z, C, K, q and N: the declared N (public) or the DP count
        "epsilon_spent": PUBLIC,  # a function of the charged events' public parameters
        "epsilons": PUBLIC,
        "public_calls": PUBLIC,  # mutation and critique calls (public inputs)
        "public_prompt_tokens": PUBLIC,
        "public_completion_tokens": PUBLIC,
        "planned_private_evaluations": DP_OUTPUT,  # q N K with the declared or DP-counted N, not the real count
        "error_share_estimate": DP_OUTPUT,  # noisy count of failed records / q N (dp.max_error_share), or None
        "error_share_noise_std": DP_OUTPUT,  # its noise std / q N: z_err and the declared or DP-counted N
        "private_calls": OPERATOR_ONLY,  # depend on the secret subsample
        "private_prompt_tokens": OPERATOR_ONLY,
        "private_completion_tokens": OPERATOR_ONLY,
        "seconds": OPERATOR_ONLY,  # wall time includes the private scoring phase
    },
    # result.json
    "result": {
        "prompt": DP_OUTPUT,
        "candidate_id": DP_OUTPUT,
        "estimate": DP_OUTPUT,
        "epsilon": PUBLIC,
        "delta": PUBLIC,
        "epsilons": PUBLIC,
        "generations_run": PUBLIC,  # stops depend on the budget and public events only
        "stopped_because": PUBLIC,
        "unsafe": PUBLIC,
        "noise": PUBLIC,
        "history": NESTED + "metrics",
        "lineage": DP_OUTPUT,
        "evaluation": PUBLIC,  # the user's test split: not private training data
        "public_usage": PUBLIC,
        "planned_private_evaluations": DP_OUTPUT,  # from the declared (public) or DP-counted N
        "fewshot": PUBLIC,  # the audit's positive control: says it is NOT private
        "labelling": DP_OUTPUT,  # the labelling phase's release: labels.json's payload (channel `labelling`)
        "final_estimate": DP_OUTPUT,  # dp.final_estimate: the released prompt re-scored (channel `final_estimate`)
        "seconds": OPERATOR_ONLY,
        "engine_usage": OPERATOR_ONLY,  # totals include the private phase
    },
    # labels.json: the labelling phase's release (dp.labelling, docs/privacy.md "Demonstrations from
    # private labels"); also the `labelling` field of result.json
    "labelling": {
        "mechanism": PUBLIC,  # gnmax | confident_gnmax, and its calibrated parameters
        "sigma": PUBLIC,
        "noise_multiplier": PUBLIC,
        "l2_sensitivity": PUBLIC,
        "num_labels": PUBLIC,
        "threshold": PUBLIC,
        "threshold_sigma": PUBLIC,
        "max_count_sensitivity": PUBLIC,
        # token_gnmax (generation tasks: DP answers voted token by token), its public settings
        "max_tokens": PUBLIC,  # the cap on an answer's tokens, every step charged
        "sampling_rate": PUBLIC,  # the Poisson subsample rate of each answer's teachers
        "candidates": PUBLIC,  # the public model's top tokens per step
        "copy_input": PUBLIC,  # the public input's tokens are candidates too
        "max_input_tokens": PUBLIC,  # synthetic demonstrations: the cap on a generated input
        "answer_filter": PUBLIC,  # the public rule that drops released answers (post-processing)
        "vote": PUBLIC,  # token by token, or one vote per answer over the input's spans
        "max_answer_tokens": PUBLIC,  # span vote: the public cap on a teacher's answer and a span
        "synthetic_inputs": DP_OUTPUT,  # synthetic demonstrations: the generated inputs (token votes)
        "queries": PUBLIC,  # the public inputs asked (the first ones of the public pool)
        "teachers": PUBLIC,  # settings (or the default from the declared or DP-counted N)
        "max_demos": PUBLIC,
        "epsilon_share": PUBLIC,
        "epsilon": PUBLIC,  # the labelling's own bound: a function of its public parameters
        "epsilons": PUBLIC,
        "ledger_label": PUBLIC,
        "inputs": PUBLIC,  # the public inputs asked, in order
        "labels": DP_OUTPUT,  # per input: the noisy vote's label or answer, or None (not answered)
        "answered": DP_OUTPUT,  # how many inputs got a label: a function of the labels
        "examples": DP_OUTPUT,  # the answered inputs with their labels
    },
    # The fresh DP estimate of the released prompt (dp.final_estimate): result.json's `final_estimate`
    "final_estimate": {
        "candidate_id": DP_OUTPUT,  # the released prompt's id
        "estimate": DP_OUTPUT,  # noisy sum on a fresh Poisson subsample / q_f N, clipped to [0, C]
        "noise_std": PUBLIC,  # z_f C / (q_f N): the calibrated noise and the declared N (or the DP count)
        "sampling_std_bound": PUBLIC,  # C sqrt((1 - q_f) / (q_f N)): public rate and N
        "interval": DP_OUTPUT,  # estimate +- 1.96 x both, clipped
        "sampling_rate": PUBLIC,
        "expected_batch_size": PUBLIC,  # q_f N with the declared or DP-counted N
    },
    # checkpoint.json (meant to be resumable anywhere, so it is released too)
    "checkpoint": {
        "format": PUBLIC,
        "generation": PUBLIC,
        "config": PUBLIC,  # its counted_dataset_size (N not declared) is the DP count of N
        "plan_value": PUBLIC,  # the calibrated parameter: a function of the schedule (whose q may
        # come from the DP count of N: post-processing)
        "population": DP_OUTPUT,  # texts chosen and scored by DP mechanisms
        "public_rng_state": PUBLIC,  # advanced by public choices only
        "history": NESTED + "metrics",
        "stopped_because": PUBLIC,
        "variable_value": DP_OUTPUT,
        "charges": PUBLIC,  # ledger entries so far (the ledger itself is released)
        "interrupted_charges": PUBLIC,  # counted from the ledger and the checkpoints
    },
    # config.json
    "config": {
        "task": PUBLIC,
        "task_kind": PUBLIC,  # classify or generate: the run file's
        "metric": PUBLIC,  # the task's metric name: the run file's
        "engine": PUBLIC,
        "config": PUBLIC,  # settings; with N not declared its counted_dataset_size and the q and
        # delta derived from it are post-processing of the DP count of N
        "seed_prompt": PUBLIC,
        "noise_multiplier": PUBLIC,
        "selection_epsilon": PUBLIC,
        "dataset_size": DP_OUTPUT,  # the declared N (public) or the DP count of N (docs/privacy.md)
        "noise": PUBLIC,
    },
    # one line of runs/run_metadata.jsonl
    "run_log": {
        "run_dir": PUBLIC,
        "task": PUBLIC,
        "engine": PUBLIC,
        "config": PUBLIC,
        "noise_seeded_insecurely": PUBLIC,
        "noise": PUBLIC,
        "epsilon": PUBLIC,
        "delta": PUBLIC,
        "epsilon_by_accountant": PUBLIC,
        "accountant": PUBLIC,
        "unsafe": PUBLIC,
        "machine": PUBLIC,
        "code_version": PUBLIC,
        "started": PUBLIC,  # taken before any private record is read
        "seconds": OPERATOR_ONLY,
        "event": PUBLIC,  # started | resumed | finished | failed
        "generation": PUBLIC,  # where a resumed run continues (checkpoints are public)
        "generations_run": PUBLIC,
        "stopped_because": PUBLIC,  # budget and user events only
        "stopped_early": PUBLIC,
        "why": PUBLIC,  # a fixed phrase per failure kind, never error text
    },
    # federation.json of a federated run (docs/federated.md)
    "federation": {
        "placement": PUBLIC,
        "silos": PUBLIC,
        "silo_names": PUBLIC,
        "silo_sizes": PUBLIC,  # each silo's declared size, or the DP count it released
        "jse": PUBLIC,
        "control_variate": PUBLIC,
        "secure_aggregation": PUBLIC,  # a setting: whether the silos' values were summed by SecAgg+
        "total_noise_factor": PUBLIC,  # std of the noise on the total / sigma: a function of S
        "unmask_threshold": PUBLIC,  # t of SecAgg+ (a function of S): each silo adds sigma^2 / t
        "size_source": PUBLIC,  # declared | dp_count | equal_shares: where silo_sizes come from
        "coupling_error": PUBLIC,  # fixed-point bound from public sizes, clip bound and noise stds
        "guarantees": PUBLIC,  # from the charged events' public parameters
        "transport": PUBLIC,
        "evaluation": PUBLIC,  # the coordinator's public test split
        "seconds": OPERATOR_ONLY,
    },
    # one line of the run log per audit (docs/audit.md): research results about canaries or synthetic
    # mechanism runs; everything but the time of a run that read private records is public.
    "audit_log": {
        "seconds": OPERATOR_ONLY,
        "*": PUBLIC,
    },
    # one line of ledger.jsonl per charge
    "ledger_entry": {
        "index": PUBLIC,
        "label": PUBLIC,
        "event": PUBLIC,
        "epsilons": PUBLIC,
        "epsilon": PUBLIC,
        "metadata": PUBLIC,  # mechanism parameters and candidate ids only
        "differentially_private": PUBLIC,
        "note": PUBLIC,
        # No timestamps: the times between charges would time the private phase.
    },
    # `optimize --json` and run-event sinks (dp_textgrad.run_events): the start and lifetime events.
    # Generation and finished events carry the released fields of `metrics` and `result`.
    "events": {
        "event": PUBLIC,  # start | lifetime | generation | finished
        "epsilon": PUBLIC,
        "delta": PUBLIC,
        "generations": PUBLIC,
        "population": PUBLIC,
        "parents": PUBLIC,
        "sampling_rate": PUBLIC,
        "dataset_size": DP_OUTPUT,  # the declared N (public) or the DP count of N (docs/privacy.md)
        "selection": PUBLIC,
        "mechanism": PUBLIC,
        "noise_multiplier": PUBLIC,
        "selection_epsilon": PUBLIC,
        "noise_secure": PUBLIC,
        "privacy": PUBLIC,
        "mode": PUBLIC,
        "resumed": PUBLIC,
        "generation": PUBLIC,  # where the run starts (checkpoints are public)
        "epsilon_spent": PUBLIC,  # the ledger's: a function of the public schedule
        "interrupted_charges": PUBLIC,
        "task_kind": PUBLIC,  # classify or generate: the run file's
        "metric": PUBLIC,  # the task's metric name: the run file's
        "lifetime_epsilon": PUBLIC,  # composed epsilons of public schedules
        "lifetime_epsilon_with_plan": PUBLIC,
        "lifetime_accountant": PUBLIC,
        "lifetime_cap": PUBLIC,
        "lifetime_cap_overridden": PUBLIC,
        "lifetime_delta": PUBLIC,  # the dataset's one lifetime delta (declared or its first run's)
        "lifetime_filter_epsilon": PUBLIC,  # the Renyi filter bound the cap is checked against
        "lifetime_filter_epsilon_with_plan": PUBLIC,
        "dataset_key": PUBLIC,  # the name the data's owner declared; never the fingerprint
        "run_dir": PUBLIC,
        "stopped_early": PUBLIC,
        "store": OPERATOR_ONLY,  # a path on the operator's machine
    },
}

# Channels that are not structured payloads: what each may carry (docs/privacy.md lists them).
TEXT_CHANNELS: dict[str, str] = {
    "report.md, report.html, plots/": "rendered from released files only (result.json, metrics.jsonl, "
    "config.json, audit.json); never from operator/",
    "released_prompt.txt": "the DP-released prompt",
    "MLflow (--mlflow)": "the `events` objects as parameters and metrics (the lifetime store's path left "
    "out), tags stopped_because / run_dir name / failing error class, and the released "
    "files report.*, plots/, result.json, released_prompt.txt as artifacts",
    "operator/cli_settings.json": "operator-only: the command line's settings, which `optimize --resume` reads; "
    "they hold the private file's absolute path and name, so they stay out of what is shared (config.json "
    "holds the run's public DP settings)",
    "federation_settings.json": "a federated run's settings (public; what `federated --resume` continues with)",
    "silo_accounts/": "each silo's own account: the events its noise answered and the releases it sent, from "
    "public parameters only (in a deployment each silo keeps its own file)",
    "silo_counts.json": "a federated run's silo sizes: declared, or each silo's DP count of its records "
    "(discrete Laplace at the silo, charged in its account and in the ledger's first stage)",
    "secure_sum_coupling.json": "the fixed-point coupling error of a federated run's secure sums so far (from "
    "public sizes, clip bound and noise stds)",
    "console (stdout)": "budget, plan and public costs; per generation: generation, DP estimates, epsilon spent; "
    "with --json one `events` object per line; with --quiet only the run directory",
    "console (stderr)": "one-line errors that quote no private record and no private-derived number; "
    "validation errors before any charge may name rows of the private file",
    "exception messages and --debug tracebacks": "a failure of the scoring machinery itself (a worker "
    "process that dies) is rewritten at the scorer into a fixed message; no local variables are shown",
    "log records and warnings": "none computed from private records",
    "file modification times": "every file and folder of a run directory outside operator/ (the run directory "
    "and plots/ included) and the runs root's run log carry one fixed public time, `runs.RELEASED_FILE_TIME` "
    "(2000-01-01T00:00:00Z), set before each atomic rename and again at the end of every path that writes a "
    "run directory (`runs.stamp_released`); files under operator/ keep real times",
    "tracking timestamps (MLflow)": "public: the run starts when the tracker is built (before the run), each "
    "generation's metrics are stamped start + generation seconds, the run ends at start + (last generation "
    "+ 1) seconds; artifacts keep the released file time",
    "per-record failures": "a record whose engine call, pipeline or program raises scores 0 under every "
    "candidate and adds one unit to the public `error` category of a failure histogram (the same rule for "
    "every record, at most one unit: the sensitivities hold); the run goes on, and the count and the error "
    "text go to operator/errors.log; only `dp.max_error_share` lets failures stop a run, through their "
    "noisy count released with the scores (dp_output)",
    "exit codes": "0 released, 3 released after an early stop (budget, callback, or the noisy share of "
    "failed records over `dp.max_error_share`), 1 run failure (a public probe before any charge, a scoring "
    "worker that dies), 2 bad input, 130 interrupted: decided by public events and DP outputs, never by "
    "one record's failure",
    "generated outputs (generation tasks)": "never released: each output on a private record, its length "
    "and token count, whether it hit `max_new_tokens`, and the time it took stay in the scorer's frame; what "
    "leaves is the noisy score sums and, where an LLM operator reads it, the noisy failure histogram over the "
    "metric's public categories (dp_output)",
    "judge and metric calls on private outputs": "never released: the judge's prompt, reply and grade and a "
    "metric's value or error text stay in the scorer's frame (a metric that raises or a grade that does not "
    "parse scores 0, the same rule for every record); a judge on the run's engine counts in the private "
    "phase's usage (operator/), never in `public_usage`",
    "operator/": "operator-only values (real private-phase usage and time, raw engine error text): "
    "derived from private data without noise, do not share; also the run's subsample secret "
    '(`run_secret`) and the journal of releases (`releases/`), see "Interruptions"',
}


def classify(channel: str, name: str) -> str:
    try:
        fields = CHANNELS[channel]
    except KeyError:
        raise UnclassifiedFieldError(
            f"release: unknown channel {channel!r}; add it to dp_textgrad.privacy.release.CHANNELS"
        ) from None
    if name not in fields and "*" not in fields:
        raise UnclassifiedFieldError(
            f"release: field {name!r} of channel {channel!r} is not classified; add it to "
            "dp_textgrad.privacy.release.CHANNELS as public, dp_output or operator_only"
        )
    return fields.get(name, fields.get("*", ""))


def split(channel: str, payload: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(released, operator_only) parts of ``payload`` under the table; nested channels recurse."""
    if channel not in CHANNELS:
        classify(channel, "")  # raises: unknown channel
    released: dict[str, Any] = {}
    operator: dict[str, Any] = {}
    for name, value in payload.items():
        kind = classify(channel, name)
        if kind.startswith(NESTED):
            inner = kind[len(NESTED) :]
            parts = [split(inner, item) for item in (value or [])]
            released[name] = [public for public, _ in parts]
            hidden = [private for _, private in parts]
            if any(hidden):
                operator[name] = hidden
        elif kind == OPERATOR_ONLY:
            operator[name] = value
        else:
            released[name] = value
    return released, operator


def released(channel: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """The part of ``payload`` that may leave the operator's hands."""
    return split(channel, payload)[0]


def channel_table() -> str:
    """The table as Markdown (for docs/privacy.md)."""
    lines = ["| channel | field | class |", "|---|---|---|"]
    for channel, fields in CHANNELS.items():
        for name, kind in fields.items():
            shown = f"list of `{kind[len(NESTED) :]}` payloads" if kind.startswith(NESTED) else kind
            lines.append(f"| {channel} | `{name}` | {shown} |")
    lines += ["", "| channel | what it may carry |", "|---|---|"]
    lines += [f"| {name} | {rule} |" for name, rule in TEXT_CHANNELS.items()]
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(channel_table())
