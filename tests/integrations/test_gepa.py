"""GEPA's call shape run by DP-ES (dp_textgrad/integrations/gepa.py): a user's own GEPAAdapter
scores one private record per call without traces, the ledger is the plan, every GEPA argument
that reads private traces or exact scores is refused by name, and a canary record that GEPA's own
reflection copies into its best candidate never reaches ours."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("gepa")

from gepa.core.adapter import EvaluationBatch, GEPAAdapter  # noqa: E402

from dp_textgrad.dp_es.config import ConfigError, DPESConfig  # noqa: E402
from dp_textgrad.dp_es.plan import RunPlan  # noqa: E402
from dp_textgrad.dp_es.preflight import PreflightError  # noqa: E402
from dp_textgrad.engines.scripted import ScriptedEngine  # noqa: E402
from dp_textgrad.integrations import gepa as dp_gepa  # noqa: E402
from dp_textgrad.privacy.accounting.events import group_events  # noqa: E402
from dp_textgrad.privacy.accounting.serialize import event_to_dict  # noqa: E402
from tests.subprocess_driver import run_driver  # noqa: E402

CANARY = "ZEBRA-CANARY-93"
SEED = {"instructions": "Answer the question.", "format": "Reply with one word."}


def private_records(n: int = 12, canary: bool = False) -> list[dict[str, Any]]:
    records = [{"id": i, "input": f"question {i}", "answer": "yes" if i % 2 else "no"} for i in range(n)]
    if canary:
        records[1] = {"id": 1, "input": f"what is the code of {CANARY}", "answer": CANARY}
    return records


PUBLIC = [{"id": "p0", "input": "is water wet", "answer": "yes"}, {"id": "p1", "input": "is fire cold", "answer": "no"}]


class KeywordAdapter(GEPAAdapter):
    """A user's GEPA adapter on a toy task: a record scores 1 when its answer is in the candidate's
    instruction, 0.5 when the instruction mentions the answers at all. It records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], bool, dict[str, str]]] = []
        self.reflected = 0
        self._lock = threading.Lock()

    def evaluate(self, batch, candidate, capture_traces=False):
        with self._lock:
            self.calls.append((tuple(r["id"] for r in batch), capture_traces, dict(candidate)))
        text = candidate["instructions"]
        scores = [1.0 if r["answer"] in text else 0.5 if "answer" in text.lower() else 0.0 for r in batch]
        trajectories = [{"record": r, "score": s} for r, s in zip(batch, scores)] if capture_traces else None
        return EvaluationBatch(outputs=[text] * len(batch), scores=scores, trajectories=trajectories)

    def make_reflective_dataset(self, candidate, eval_batch, components_to_update):
        self.reflected += 1
        return {
            name: [
                {
                    "Inputs": t["record"]["input"],
                    "Generated Outputs": "",
                    "Feedback": f"The correct answer is {t['record']['answer']}.",
                }
                for t in eval_batch.trajectories
            ]
            for name in components_to_update
        }


SCHEDULE = dict(epsilon=2.0, generations=2, population=3, parents=2, sampling_rate=0.5, insecure_noise_seed=3)


_OWN_ADAPTER = object()


def run(tmp_path: Path, adapter: Any = _OWN_ADAPTER, **overrides: Any) -> dp_gepa.DPGEPAResult:
    """One run on the toy task; an override of None drops a schedule setting (max_metric_calls sets it)."""
    options: dict[str, Any] = dict(
        seed_candidate=SEED,
        trainset=private_records(),
        adapter=KeywordAdapter() if adapter is _OWN_ADAPTER else adapter,
        component="instructions",
        public_trainset=PUBLIC,
        engine=ScriptedEngine(),
        dataset_size=12,
        runs_root=tmp_path,
        **SCHEDULE,
    )
    options.update(overrides)
    return dp_gepa.optimize(**{k: v for k, v in options.items() if not (k in SCHEDULE and v is None)})


# -- 1. the adapter sees one private record per call, never with traces ------------------------
def test_a_custom_adapter_scores_one_record_per_call_without_traces(tmp_path) -> None:
    adapter = KeywordAdapter()
    valset = [{"id": f"v{i}", "input": f"val {i}", "answer": "yes"} for i in range(3)]
    # GEPA arguments that ask for nothing are accepted (a GEPA call ported as it is)
    result = run(tmp_path, adapter, valset=valset, use_merge=False, track_best_outputs=False, raise_on_exception=True)

    private_ids = {r["id"] for r in private_records()}
    public_ids = {r["id"] for r in PUBLIC}
    during_run = [call for call in adapter.calls if not any(str(i).startswith("v") for i in call[0])]
    assert during_run, "the adapter was never called"
    assert any(set(ids) <= private_ids for ids, _, _ in during_run), "no private record was scored"
    for ids, traces, candidate in during_run:
        assert len(ids) == 1 and traces is False
        assert set(ids) <= private_ids | public_ids
        assert candidate["format"] == SEED["format"]  # the other component stays fixed
    assert adapter.reflected == 0  # make_reflective_dataset is never called

    # GEPA's fields, and the guarantee
    assert result.candidates[0] == SEED
    assert result.best_candidate == result.candidates[result.best_idx] == result.candidates[-1]
    assert result.best_candidate["format"] == SEED["format"]
    assert result.best_candidate["instructions"] == result.outcome.result.prompt
    assert result.val_aggregate_scores is not None and len(result.val_aggregate_scores) == result.num_candidates
    guarantee = result.dp_guarantee
    assert 0 < guarantee.epsilon <= SCHEDULE["epsilon"] + 1e-9
    assert guarantee.epsilon == guarantee.epsilons[guarantee.accountant] == min(guarantee.epsilons.values())
    assert guarantee.run_id == result.outcome.run_dir.name and (result.outcome.run_dir / "ledger.jsonl").is_file()
    assert "INSECURE" in str(guarantee.noise) and guarantee.differentially_private is False  # seeded noise
    assert guarantee.optimized == "instructions" and guarantee.estimate == result.outcome.result.estimate
    # q N K per generation, 2 generations: planned from the declared N, not a count of calls
    assert result.expected_metric_calls == pytest.approx(0.5 * 12 * 3 * 2)


def test_public_demonstrations_come_from_public_trainset_only(tmp_path) -> None:
    result = run(tmp_path, engine=None, generations=3, population=4)  # default: no model, rule edits and demos
    texts = "\n".join(c["instructions"] for c in result.candidates)
    for record in private_records():
        assert record["input"] not in texts
    for name in ("config.json", "result.json", "checkpoint.json"):
        released = (result.outcome.run_dir / name).read_text(encoding="utf-8")
        assert not any(r["input"] in released for r in private_records())
    assert dp_gepa.render_instance(PUBLIC[0]) == "id: p0\ninput: is water wet\nanswer: yes"


@dataclass
class Instance:
    question: str
    context: dict[str, str]
    answer: str = ""


def test_render_instance_is_adapter_neutral() -> None:
    default_inst = {"input": "2+2?", "additional_context": {}, "answer": "4"}
    assert dp_gepa.render_instance(default_inst) == "input: 2+2?\nanswer: 4"  # empty fields left out
    assert dp_gepa.render_instance(Instance("why?", {"k": "v"})) == 'question: why?\ncontext: {"k": "v"}'
    assert dp_gepa.render_instance(("a", 1)) == "('a', 1)"


# -- 2. the ledger is the plan ------------------------------------------------------------------
def planned_atoms(run_dir: Path) -> list[dict]:
    config = DPESConfig(**json.loads((run_dir / "config.json").read_text(encoding="utf-8"))["config"])
    plan = RunPlan.with_value(config, json.loads((run_dir / "checkpoint.json").read_text())["plan_value"])
    return [event_to_dict(event) for event in plan.charges()]


@pytest.mark.parametrize(
    "overrides",
    [dict(dataset_size=12), dict(dataset_size=None, final_selection="exponential", final_epsilon=0.2)],
    ids=["N declared", "N counted, charged final"],
)
def test_the_ledger_equals_the_plan(tmp_path, overrides) -> None:
    result = run(tmp_path, **overrides)
    optimizer = result.outcome.optimizer
    assert group_events(optimizer.ledger.events) == group_events([optimizer.plan.event])
    lines = (result.outcome.run_dir / "ledger.jsonl").read_text().splitlines()[1:]
    search = [json.loads(line) for line in lines if json.loads(line)["label"].startswith(("generation ", "final "))]
    assert [c["event"] for c in search] == planned_atoms(result.outcome.run_dir)


def test_max_metric_calls_becomes_the_schedule(tmp_path) -> None:
    # population 3 x q N = 0.5 x 12 records: 18 expected calls a generation; 40 pays for 2
    reports: list[Any] = []
    result = run(tmp_path, generations=None, max_metric_calls=40, observers=[reports.append])
    assert result.outcome.optimizer.config.generations == 2
    assert [r.generation for r in reports] == [0, 1]  # observers get the run's released reports
    assert result.expected_metric_calls == pytest.approx(36.0) and result.expected_metric_calls <= 40


# -- 3. refusals --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(dp_gepa.GEPA_REFUSED_ARGUMENTS))
def test_every_gepa_argument_that_reads_private_data_is_refused_by_name(tmp_path, name) -> None:
    adapter = KeywordAdapter()
    with pytest.raises(ConfigError, match=rf"^{name}: refused: "):
        run(tmp_path, adapter, **{name: object()})
    assert adapter.calls == [] and not list(tmp_path.iterdir())  # refused before anything ran


def test_every_argument_of_gepa_optimize_is_taken_or_refused() -> None:
    import inspect

    import gepa

    ours = set(inspect.signature(dp_gepa.optimize).parameters)
    unhandled = [
        name
        for name in inspect.signature(gepa.optimize).parameters
        if name not in ours and name not in dp_gepa.GEPA_REFUSED_ARGUMENTS and name not in DPESConfig.model_fields
    ]
    assert unhandled == []  # a new GEPA argument must be supported or refused by name, never ignored


def test_typical_gepa_arguments_are_refused_with_why(tmp_path) -> None:
    with pytest.raises(ConfigError, match="reflection_lm: refused: .*raw trainset traces.*engine="):
        run(tmp_path, reflection_lm="openai/gpt-4.1")
    with pytest.raises(ConfigError, match="candidate_selection_strategy: refused: .*Pareto"):
        run(tmp_path, candidate_selection_strategy="pareto")
    with pytest.raises(ConfigError, match="use_merge: refused"):
        run(tmp_path, use_merge=True)
    with pytest.raises(ConfigError, match="skip_perfect_score: refused"):
        run(tmp_path, skip_perfect_score=True)


def _raises(tmp_path: Path, pattern: str, **overrides: Any) -> None:
    adapter = overrides.pop("adapter", KeywordAdapter())
    with pytest.raises(ConfigError, match=pattern):
        run(tmp_path, adapter, **overrides)
    assert not getattr(adapter, "calls", None)  # refused before the adapter ran


def test_bad_calls_are_refused_naming_the_field_and_the_fix(tmp_path) -> None:
    _raises(tmp_path, r"component: 'prompt' not in seed_candidate", component="prompt")
    _raises(tmp_path, r"component: 'prompt' not in seed_candidate", component=["format", "prompt"])
    _raises(tmp_path, r"component: a component's name, a list of names, or None", component=[])
    _raises(tmp_path, "seed_candidate: must be a non-empty dict", seed_candidate={})
    _raises(tmp_path, "seed_candidate: component 'instructions' is empty", seed_candidate={"instructions": " "})
    _raises(tmp_path, "task_lm: a model string .* is refused.*task_lm_from_engine", adapter=None, task_lm="openai/x")
    _raises(tmp_path, "task_lm: with an adapter", task_lm=lambda messages: "")
    _raises(tmp_path, "adapter: give your GEPAAdapter, or task_lm", adapter=None)
    _raises(tmp_path, "adapter: expected a GEPAAdapter", adapter=object())
    _raises(tmp_path, "mode: refused: mode='unsafe'", mode="unsafe")
    _raises(tmp_path, "privacy: refused", privacy="off")
    _raises(tmp_path, "llm_operators: True needs a model", engine=None, llm_operators=True)
    _raises(tmp_path, "perfect_score: must be a finite number > 0", perfect_score=0)
    _raises(tmp_path, "trainset: empty", trainset=[])
    _raises(tmp_path, "valset: empty", valset=[])
    _raises(tmp_path, "max_metric_calls: give it or generations", max_metric_calls=100)
    _raises(
        tmp_path,
        r"max_metric_calls: 10 cannot pay for one generation: population 3 x an expected batch of 6",
        generations=None,
        max_metric_calls=10,
    )
    _raises(
        tmp_path,
        "max_metric_calls: with sampling_rate set and no dataset_size",
        generations=None,
        dataset_size=None,
        max_metric_calls=10_000,
    )
    _raises(tmp_path, "generations", generations=0)  # a DP-ES setting: DPESConfig names it


# -- 4. the adapter's contract, on public and private data ---------------------------------------
class TwoScoreAdapter(KeywordAdapter):
    def evaluate(self, batch, candidate, capture_traces=False):
        out = super().evaluate(batch, candidate, capture_traces)
        return EvaluationBatch(outputs=out.outputs * 2, scores=out.scores * 2)


def test_a_malformed_adapter_fails_the_public_probe_before_any_charge(tmp_path) -> None:
    adapter = TwoScoreAdapter()
    with pytest.raises(PreflightError, match="scores hold one number"):
        run(tmp_path, adapter)
    assert all(set(ids) <= {r["id"] for r in PUBLIC} for ids, _, _ in adapter.calls)


class FailingOnPrivate(KeywordAdapter):
    def evaluate(self, batch, candidate, capture_traces=False):
        if batch[0]["id"] not in ("p0", "p1"):
            raise RuntimeError(f"model crashed on {batch[0]['input']}")
        return super().evaluate(batch, candidate, capture_traces)


def test_an_adapter_error_on_a_private_record_is_data_and_quotes_no_record(tmp_path) -> None:
    # Every private record fails: each scores 0 in the `error` category, the run still ends as planned.
    result = run(tmp_path, FailingOnPrivate())
    assert result is not None
    for path in tmp_path.rglob("*"):
        if path.is_file() and "operator" not in path.relative_to(tmp_path).parts:
            assert not re.search(r"question \d", path.read_text(encoding="utf-8", errors="replace")), path
    errors = next(tmp_path.rglob("operator/errors.log")).read_text()
    assert "model crashed on question" in errors  # the operator keeps the detail


def test_the_default_adapter_path_with_a_callable_task_lm(tmp_path) -> None:
    seen: list[list[dict[str, str]]] = []

    def task_lm(messages):
        seen.append(list(messages))
        return "yes" if "yes" in messages[0]["content"] else "no"

    records = [{"input": f"q{i}", "additional_context": {}, "answer": "yes" if i % 2 else "no"} for i in range(8)]
    result = dp_gepa.optimize(
        {"system_prompt": "Say yes or no."},
        records,
        task_lm=task_lm,
        engine=ScriptedEngine(),
        dataset_size=8,
        runs_root=tmp_path,
        **{**SCHEDULE, "insecure_noise_seed": None},  # secure noise: a guarantee
    )
    assert seen and all(len(m) == 2 and m[0]["role"] == "system" and m[1]["role"] == "user" for m in seen)
    # the records' inputs, and the public probe's (no public instance given: a fixed public text)
    assert {m[1]["content"] for m in seen} <= {r["input"] for r in records} | {dp_gepa.PROBE_INPUT}
    assert result.best_candidate["system_prompt"] == result.outcome.result.prompt
    assert result.dp_guarantee.differentially_private is True


def test_task_lm_from_engine_serves_gepa_messages() -> None:
    engine = ScriptedEngine(["an answer"])
    complete = dp_gepa.task_lm_from_engine(engine, max_tokens=5)
    assert complete([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]) == "an answer"
    (call,) = engine.history
    assert (call.prompt, call.system_prompt, call.temperature, call.max_tokens) == ("Hi", "Be brief.", 0.0, 5)
    with pytest.raises(TypeError, match="engine: expected a dp-textgrad engine"):
        dp_gepa.task_lm_from_engine(object())


# -- 5. the canary: GEPA's reflection copies it into the candidate, DP-ES never does -------------
def copying_reflection_lm(prompt: Any) -> str:
    """A stand-in reflection LM that, like real reflection, copies facts from the reflective dataset."""
    text = prompt if isinstance(prompt, str) else "\n".join(str(m["content"]) for m in prompt)
    facts = re.findall(r"The correct answer is ([^.\n]+)\.", text)
    return "```\nAnswer the question. Known answers: " + ", ".join(facts) + "\n```"


def test_a_canary_reaches_gepas_best_candidate_and_never_ours(tmp_path, capsys) -> None:
    import gepa

    records = private_records(3, canary=True)
    stock = gepa.optimize(
        seed_candidate={"instructions": SEED["instructions"]},
        trainset=records,
        adapter=KeywordAdapter(),
        reflection_lm=copying_reflection_lm,
        max_metric_calls=20,
    )
    assert CANARY in stock.best_candidate["instructions"]  # the test can see a leak
    capsys.readouterr()  # GEPA's own log, discarded

    adapter = KeywordAdapter()
    ours = dp_gepa.optimize(
        {"instructions": SEED["instructions"]},
        private_records(12, canary=True),
        adapter=adapter,
        public_trainset=PUBLIC,
        engine=ScriptedEngine(),
        dataset_size=12,
        runs_root=tmp_path,
        **{**SCHEDULE, "generations": 3, "sampling_rate": 1.0},
    )
    assert any(ids == (1,) for ids, _, _ in adapter.calls), "the canary record was never scored"
    assert all(CANARY not in c["instructions"] for c in ours.candidates)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert CANARY not in path.read_text(encoding="utf-8", errors="replace"), path
    printed = capsys.readouterr()
    assert CANARY not in printed.out + printed.err


def test_importing_the_module_imports_no_gepa() -> None:
    child = run_driver(
        "import sys\nimport dp_textgrad.integrations.gepa",
        "assert 'gepa' not in sys.modules and 'litellm' not in sys.modules\nprint('ok')",
    )
    assert child.stdout.strip() == "ok"


# -- 6. a real task model: llama.cpp's server on loopback -----------------------------------------
@pytest.mark.slow
def test_gepa_shape_with_the_llama_cpp_server_as_task_model(openai_llama_engine, tmp_path) -> None:
    responses: list[str] = []
    serve = dp_gepa.task_lm_from_engine(openai_llama_engine, max_tokens=4)

    def task_lm(messages):
        responses.append(serve(messages))
        return responses[-1]

    facts = [
        ("The capital of France is", "Paris"),
        ("The capital of Italy is", "Rome"),
        ("The capital of Spain is", "Madrid"),
        ("The capital of Germany is", "Berlin"),
        ("The capital of Japan is", "Tokyo"),
        ("The capital of Egypt is", "Cairo"),
    ]
    records = [{"input": q, "additional_context": {}, "answer": a} for q, a in facts]
    public = [{"input": "The capital of England is", "additional_context": {}, "answer": "London"}]
    result = dp_gepa.optimize(
        {"system_prompt": "Complete the sentence with one word."},
        records,
        valset=public,
        task_lm=task_lm,
        public_trainset=public,
        dataset_size=len(records),
        runs_root=tmp_path,
        epsilon=4.0,
        generations=1,
        population=2,
        parents=1,
        sampling_rate=0.5,
        insecure_noise_seed=5,
    )
    assert responses and any(r.strip() for r in responses), "the server never answered"
    assert openai_llama_engine.usage.calls > 0
    assert 0 < result.dp_guarantee.epsilon <= 4.0
    assert result.val_aggregate_scores is not None and len(result.val_aggregate_scores) == result.num_candidates


def test_task_lm_from_an_engine_with_a_cache_directory_is_refused(tmp_path) -> None:
    from dp_textgrad.engines.llama_support import GenerationCache
    from dp_textgrad.engines.scripted import ScriptedEngine
    from dp_textgrad.integrations.gepa import task_lm_from_engine

    engine = ScriptedEngine(default="ok")
    engine.cache = GenerationCache(tmp_path / "generations")
    with pytest.raises(ConfigError, match="engine: the engine keeps its generations in a cache directory"):
        task_lm_from_engine(engine)
