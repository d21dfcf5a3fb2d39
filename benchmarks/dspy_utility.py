"""What a DSPy user gets from DPES: the same program compiled by DSPy's stock LabeledFewShot and by
DPES, on the local model, with paired intervals on one test split.

The program is ``dspy.Predict("message -> category")`` on the built-in ``support`` task (private
messages carry fake personal data; public ones have placeholders), run by the bundled Gemma 3
270M through ``EngineLM`` + ``CompletionAdapter`` (a base model). Methods, all on the same test
records:

- ``seed``: the program as written (DSPy's default instruction, no demos);
- ``fewshot_public``: ``LabeledFewShot(k)`` on the public examples (no private data);
- ``fewshot_private``: ``LabeledFewShot(k)`` on the PRIVATE trainset: what a DSPy user does today,
  which copies private records into the program (counted: ``private_records_in_program``);
- ``dpes_nonprivate``: DPES with ``privacy="off"`` (the non-private ceiling of the same search);
- ``dpes_eps<E>``: DPES at each epsilon (delta 1e-5), demos only from the public examples.

Run::

    python benchmarks/dspy_utility.py --n-private 200 --n-test 100 --seeds 0 1 \\
        --output benchmarks/results/dspy_utility_support.json

Retained gain = (DPES at epsilon - seed) / (non-private DPES - seed), paired bootstrap over test
records and seeds (``benchmarks/paired_bootstrap.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired_bootstrap import encode_outcomes, paired_bootstrap  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-private", type=int, default=200)
    parser.add_argument("--n-public", type=int, default=10)
    parser.add_argument("--n-test", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[4.0, 1.0])
    parser.add_argument("--k", type=int, default=4, help="LabeledFewShot's demonstrations")
    parser.add_argument("--auto", default="light", help="DPES's schedule preset")
    parser.add_argument("--generations", type=int, default=None, help="override the preset (smoke runs)")
    parser.add_argument("--population", type=int, default=None, help="override the preset (smoke runs)")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: free CPUs)")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import dspy

    from dp_textgrad.engines.llama_cpp import LlamaCppEngine
    from dp_textgrad.integrations.dspy import DPES, CompletionAdapter, EngineLM
    from dp_textgrad.tasks.registry import get_task

    engine = LlamaCppEngine(n_threads=args.threads) if args.threads else LlamaCppEngine()
    lm = EngineLM(engine, max_tokens=5)
    dspy.configure(lm=lm, adapter=CompletionAdapter())
    work = Path(tempfile.mkdtemp(prefix="dspy_utility_"))

    def metric(example, prediction, trace=None):
        return str(prediction.category).strip().lower() == example.category

    def score(program, example) -> float:
        try:
            return float(metric(example, program(**example.inputs())))
        except dspy.utils.exceptions.AdapterParseError:  # no parsable answer: wrong, as DPES scores it
            return 0.0

    def scores(program, test) -> np.ndarray:
        return np.array([score(program, ex) for ex in test])

    outcomes: dict[str, list[np.ndarray]] = {}
    runs: list[dict] = []
    started = time.perf_counter()
    # One dataset (data seed 0) for every seed, so that all methods and seeds share the test
    # records (paired); the seeds vary DPES's own randomness and noise.
    task = get_task("support", seed=0, n_private=args.n_private, n_public=args.n_public, n_test=args.n_test)

    def as_example(record):
        return dspy.Example(message=record.text, category=record.label).with_inputs("message")

    private = [as_example(r.unwrap()) for r in task.private_train]
    public = [as_example(r) for r in task.public_examples]
    test = [as_example(r) for r in task.test]
    for seed in args.seeds:
        program = dspy.Predict("message -> category")
        methods: dict[str, object] = {"seed": program}
        leaked = {}
        for name, trainset in (("fewshot_public", public), ("fewshot_private", private)):
            compiled = dspy.LabeledFewShot(k=args.k).compile(program, trainset=trainset)
            path = work / f"{name}_{seed}.json"
            compiled.save(str(path))
            saved = path.read_text(encoding="utf-8")
            leaked[name] = sum(ex.message in saved for ex in private)
            methods[name] = compiled
        schedule = {k: v for k, v in (("generations", args.generations), ("population", args.population)) if v}
        dpes_runs = [("dpes_nonprivate", dict(privacy="off", epsilon=4.0))] + [
            (f"dpes_eps{eps:g}", dict(epsilon=eps)) for eps in args.epsilons
        ]
        seconds = {}
        for name, settings in dpes_runs:
            t0 = time.perf_counter()
            optimizer = DPES(metric, public_trainset=public, lm=lm, engine=engine, auto=args.auto,
                             runs_root=work / "runs", seed=seed, **schedule, **settings)
            compiled = optimizer.compile(program, trainset=private)
            seconds[name] = time.perf_counter() - t0
            path = work / f"{name}_{seed}.json"
            compiled.save(str(path))
            leaked[name] = sum(ex.message in path.read_text(encoding="utf-8") for ex in private)
            methods[name] = compiled
            runs.append({"seed": seed, "method": name, "epsilon_spent": compiled.dp_guarantee.epsilon,
                         "differentially_private": compiled.dp_guarantee.differentially_private,
                         "instruction": compiled.signature.instructions})
        for name, compiled in methods.items():
            correct = scores(compiled, test)
            outcomes.setdefault(name, []).append(correct)
            runs.append({"seed": seed, "method": name, "accuracy": float(correct.mean()),
                         "outcomes": encode_outcomes(correct), "private_records_in_program": leaked.get(name, 0),
                         "compile_seconds": seconds.get(name)})
            print(f"seed {seed} {name:16s} accuracy {correct.mean():.3f}  private records in program: "
                  f"{leaked.get(name, 0)}", flush=True)
    matrices = {name: np.vstack(rows) for name, rows in outcomes.items()}
    summary = paired_bootstrap(matrices, reference="seed", ceiling="dpes_nonprivate")
    result = {
        "command": "python benchmarks/dspy_utility.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "settings": vars(args) | {"output": str(args.output) if args.output else None},
        "model": "Gemma 3 270M Q4_K_M (bundled), EngineLM(max_tokens=5) + CompletionAdapter",
        "seconds": time.perf_counter() - started,
        "summary": summary,
        "runs": runs,
    }
    for name, row in summary.items():
        print(name, json.dumps(row, default=float))
    shutil.rmtree(work, ignore_errors=True)  # the saved programs and run directories of this measurement
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2, default=float) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
