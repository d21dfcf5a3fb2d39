"""The twin-run test of a run with a labelling phase (dp.labelling, no public labelled examples).

D versus D plus one long record x (tests/twin.py), through ``dp-textgrad optimize`` with a public
unlabelled pool. Record x lands in ONE teacher's group (a keyed hash of the record); its
demonstrations may show x, which makes that teacher's prompt longer and slower, but the scripted
engine's vote depends on the public input alone, so every vote histogram, hence every DP label
under the seeded noise, is the same. Then every released byte (labels.json, result.json, the
ledger, the report, stdout, ...) must be identical; the operator-only area must see x.
"""

from __future__ import annotations

import json

import pytest

from tests.twin import CUES, LABELS, TASK_LINES, base_rows, differences, json_differences, long_record, run_twin

SCHEDULE = (
    "epsilon = 4\ngenerations = 2\npopulation = 3\nparents = 2\nsampling_rate = 0.5\n"
    'feedback = "none"\ninsecure_noise_seed = 5\n'
    "[dp.labelling]\nteachers = 4\nqueries = 6\nmax_demos = 16\n"
)
POOL = [f"{CUES[LABELS[i % 3]]} (public {i})" for i in range(8)]


def run(root, rows, monkeypatch, **kwargs):
    root.mkdir(parents=True, exist_ok=True)
    (root / "pool.txt").write_text("\n".join(POOL) + "\n", encoding="utf-8")
    return run_twin(root, rows, monkeypatch, SCHEDULE, task_lines=TASK_LINES + 'public_inputs = "pool.txt"\n',
                    **kwargs)


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    try:
        rows = base_rows(40)
        d = run(tmp_path_factory.mktemp("d"), rows, monkeypatch)
        dx = run(tmp_path_factory.mktemp("dx"), rows + [long_record(rows)], monkeypatch, coupled_extra_records=1)
    finally:
        monkeypatch.undo()
    return d, dx


def test_both_runs_label_first_and_finish(twins) -> None:
    for capture in twins:
        assert capture.exit_code == 0, capture.stdout + capture.stderr
        ledger = [json.loads(line) for line in capture.released["ledger.jsonl"].splitlines()[1:]]
        assert [entry["label"] for entry in ledger][:2] == ["dataset size: DP count", "labelling"]
        labels = json.loads(capture.released["labels.json"])
        assert labels["queries"] == 6 and labels["teachers"] == 4 and labels["inputs"] == POOL[:6]
        assert labels["answered"] == 6  # GNMax answers every input
        result = json.loads(capture.released["result.json"])
        assert result["labelling"] == labels
        assert "6 public inputs labelled first by a noisy vote (GNMax) of 4 teachers" in capture.stdout
        assert "DP labels: 6 of 6 public inputs answered" in capture.stdout
        assert "many DP labels will be noise" in " ".join(capture.stdout.split())  # sigma > 4 teachers / 2


def test_every_released_channel_is_identical(twins) -> None:
    d, dx = twins
    diff = differences(d, dx)
    details = {name: json_differences(d, dx, name) for name in diff if name.endswith((".json", ".jsonl"))}
    assert not diff, f"released channels differ between D and D+x: {diff}; fields: {json.dumps(details)}"


def test_the_operator_area_sees_the_long_record(twins) -> None:
    # Power: the teachers' and the scorer's real usage differs, so a leak of it would show.
    d, dx = twins
    assert d.operator and d.operator.keys() == dx.operator.keys()
    assert any(d.operator[name] != dx.operator[name] for name in d.operator)
    # x is one of its teacher's demonstrations (max_demos covers every group): the teachers' usage differs.
    usage = "operator/labelling_usage.json"
    assert json.loads(d.operator[usage])["prompt_tokens"] < json.loads(dx.operator[usage])["prompt_tokens"]
