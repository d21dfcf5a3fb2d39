"""A whole DP-ES optimization with the tests-only ScriptedEngine, printing the ledger.

The scripted engine runs no model: it labels a message by cue words, and it does so
more reliably when the prompt lists the labels ("Answer with exactly one of: ...").
That gives the evolution something real to find, in seconds, with no model file.

    python examples/quickstart_scripted.py
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import dp_textgrad as dpt
from dp_textgrad import DPEvolutionStrategy
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.tasks.synthetic import make_support_task

CUES = {
    " bill": ("charge", "bill", "refund", "fee", "paid", "payment"),
    " tech": ("not working", "slow", "app", "error", "connection", "crash"),
    " cancel": ("cancel", "end my", "close my", "terminate"),
    " fraud": ("unauthori", "scam", "stolen", "permission", "phishing", "never made"),
    " update": ("address", "e-mail", "update", "change my", "details", "login"),
}


def cue_rule(context: str, choices: Sequence[str]) -> list[float]:
    """Logits from cue words in the record; without a label list the "model" leans to "bill"."""
    prompt, _, record = context.rpartition("Message:")
    record = record.lower()
    lists_labels = "one of" in prompt.lower() or "categories" in prompt.lower()
    bias = 0.0 if lists_labels else 1.5
    return [sum(record.count(cue) for cue in CUES.get(choice, ())) + (bias if choice == " bill" else 0.0)
            for choice in choices]


def main() -> None:
    tg = dpt.textgrad()  # TextGrad without its import-time log file
    task = make_support_task(seed=0, n_private=600, n_test=200)
    engine = ScriptedEngine(
        responses=["Classify the support message into one of the categories: bill, tech, cancel, fraud or "
                   "update.</PROMPT>"],
        choice_rule=cue_rule,
    )
    prompt = tg.Variable(task.seed_prompt, role_description="instruction prompt", requires_grad=True)
    opt = DPEvolutionStrategy([prompt], task=task, engine=engine, epsilon=4.0, generations=5,
                              population=6, parents=2, seed=1)
    print(f"noise multiplier z = {opt.noise_multiplier:.3f} for epsilon = {opt.config.epsilon}, "
          f"delta = {opt.config.delta:.1e}, q = {opt.config.sampling_rate:.3f}")
    for _ in range(opt.generations):
        report = opt.step()
        if report is None:
            break
        print(f"generation {report.generation}: best noisy estimate {report.best_estimate:.3f}, "
              f"epsilon spent {report.epsilon_spent:.3f}")
    result = opt.finalise()
    print("\nreleased prompt:\n" + result.prompt)
    print(f"\ntest accuracy (not covered by DP): seed {task.accuracy(engine, task.seed_prompt):.3f}, "
          f"released {task.accuracy(engine, result.prompt):.3f}")
    print("\nledger:")
    for entry in opt.ledger.entries:
        print(f"  [{entry.index}] {entry.label}: epsilon so far {entry.epsilon:.4f} "
              + " ".join(f"{k}={v:.3f}" for k, v in sorted(entry.epsilons.items()) if np.isfinite(v)))
    print("privacy spent:", opt.privacy_spent())


if __name__ == "__main__":
    main()
