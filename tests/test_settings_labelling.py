"""The run file's labelling keys: ``task.public_inputs`` (a public unlabelled pool), the built-in
support task's generated pool, and ``dp.labelling`` (TOML and YAML), with their refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dp_textgrad.dp_es.config import ConfigError, LabellingConfig
from dp_textgrad.settings import OptimizeSettings, TaskSection, build_settings, read_config_file
from dp_textgrad.tasks.synthetic import FIRST_NAMES, make_support_task

ROWS = [("refund my card", "bill"), ("the app crashes", "tech"), ("charged twice", "bill"), ("login fails", "tech")]


def write_files(directory: Path) -> None:
    for name in ("train.csv", "test.csv"):
        (directory / name).write_text(
            "text,label\n" + "".join(f"{text},{label}\n" for text, label in ROWS), encoding="utf-8"
        )
    pool = "where is my refund\n\n  the router is dead  \nplease cancel\n"
    (directory / "pool.txt").write_text(pool, encoding="utf-8")


def load(path: Path) -> OptimizeSettings:
    return build_settings(read_config_file(path), {}, source=path)


TOML = """
[task]
train = "train.csv"
test = "test.csv"
public_inputs = "pool.txt"

[dp]
epsilon = 2
dataset_size = 40

[dp.labelling]
teachers = 4
queries = 2
epsilon_share = 0.4
"""

YAML = """
task:
  train: train.csv
  test: test.csv
  public_inputs: pool.txt
dp:
  epsilon: 2
  dataset_size: 40
  labelling:
    teachers: 4
    queries: 2
    epsilon_share: 0.4
"""


@pytest.mark.parametrize("name, text", [("run.toml", TOML), ("run.yaml", YAML)])
def test_a_run_file_names_a_public_pool_and_a_labelling_phase(tmp_path, name, text) -> None:
    write_files(tmp_path)
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    settings = load(path)
    assert settings.dp.labelling == LabellingConfig(teachers=4, queries=2, epsilon_share=0.4)
    # The pool's path is read relative to the run file, like the task's other files.
    assert settings.task.public_inputs == tmp_path / "pool.txt"
    assert settings.task.public_input_count() == 3
    task = settings.task.build()
    assert task.public_inputs == ["where is my refund", "the router is dead", "please cancel"]
    assert task.labels == ["bill", "tech"] and len(task.private_train) == 4  # the rest as before


@pytest.mark.parametrize("name, text, where, hint", [
    ("run.toml", TOML.replace("queries = 2", "querys = 2"), "dp.labelling.querys", "did you mean 'queries'?"),
    ("run.yaml", YAML.replace("teachers: 4", "teacher: 4"), "dp.labelling.teacher", "did you mean 'teachers'?"),
    ("run.toml", TOML.replace("epsilon_share = 0.4", "epsilon_share = 1.0"), "dp.labelling.epsilon_share",
     "must be in (0, 1)"),
    ("run.yaml", YAML.replace("queries: 2", "queries: 2\n    threshold: 3"), "dp.labelling",
     "threshold, threshold_sigma: give both"),
])
def test_a_bad_labelling_key_is_named_by_its_dotted_path(tmp_path, name, text, where, hint) -> None:
    write_files(tmp_path)
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load(path)
    message = str(caught.value)
    assert f"{where}:" in message and hint in message, message
    assert f"({name} line" in message  # the key's line in the file


def test_labelling_with_privacy_off_is_refused(tmp_path) -> None:
    write_files(tmp_path)
    path = tmp_path / "run.toml"
    path.write_text(TOML.replace("dataset_size = 40", 'dataset_size = 40\nprivacy = "off"'), encoding="utf-8")
    with pytest.raises(ConfigError, match="labelling: the teacher vote is a DP mechanism"):
        load(path)


def test_a_generation_task_takes_public_inputs_for_dp_answers(tmp_path) -> None:
    (tmp_path / "pool.txt").write_text("first request\nsecond request\n", encoding="utf-8")
    section = TaskSection(kind="generate", train=tmp_path / "a.jsonl", test=tmp_path / "b.jsonl",
                          public_inputs=tmp_path / "pool.txt")
    assert section.public_input_count() == 2
    settings = build_settings({"task": {"name": "support_extract", "options": {"public_inputs": 3}},
                               "dp": {"labelling": {"queries": 2}}}, {})
    assert settings.task.public_input_count() == 3
    assert len(settings.task.build().public_inputs) == 3
    # dp.labelling on a generation task without a pool: refused, naming where the pool comes from.
    raw = {"task": {"kind": "generate", "train": "a.jsonl", "test": "b.jsonl"}, "dp": {"labelling": {}}}
    with pytest.raises(ConfigError, match=r"dp.labelling: needs public unlabelled inputs.*task.public_inputs"):
        build_settings(raw, {})


def test_labelling_needs_a_pool_and_the_pool_one_source(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"dp.labelling: needs public unlabelled inputs.*task.public_inputs"):
        build_settings({"task": {"name": "support"}, "dp": {"labelling": {"queries": 4}}}, {})
    with pytest.raises(ValueError, match="public_inputs_column: names a column of task.public_inputs"):
        TaskSection(name="support", public_inputs_column="body")
    with pytest.raises(ValueError, match="not both"):
        TaskSection(name="support", public_inputs=tmp_path / "pool.txt", options={"public_inputs": 4})
    # The built-in pool is enough for dp.labelling.
    settings = build_settings({"task": {"name": "support", "options": {"public_inputs": 6}},
                               "dp": {"labelling": {"queries": 4}}}, {})
    assert settings.task.public_input_count() == 6


def test_a_built_in_task_takes_a_pool_from_a_column_and_bad_pools_are_named(tmp_path) -> None:
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps({"body": f"message {i}"}) + "\n" for i in range(3)), encoding="utf-8")
    task = TaskSection(name="support", public_inputs=pool, public_inputs_column="body",
                       options={"n_private": 20, "n_test": 5}).build()
    assert task.public_inputs == ["message 0", "message 1", "message 2"]
    with pytest.raises(FileNotFoundError, match="task.public_inputs: no file at"):
        TaskSection(name="support", public_inputs=tmp_path / "missing.txt").build()
    (tmp_path / "empty.txt").write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="task.public_inputs: .*holds no inputs"):
        TaskSection(name="support", public_inputs=tmp_path / "empty.txt").build()
    (tmp_path / "pool.txt").write_text("a\n", encoding="utf-8")
    with pytest.raises(ValueError, match="task.public_inputs_column: pool.txt is a .txt file"):
        TaskSection(name="support", public_inputs=tmp_path / "pool.txt", public_inputs_column="body").build()


def test_the_support_task_generates_a_public_pool_apart_from_the_other_splits() -> None:
    plain = make_support_task(seed=2, n_private=80, n_test=30)
    pooled = make_support_task(seed=2, n_private=80, n_test=30, public_inputs=25)
    assert plain.public_inputs == [] and len(pooled.public_inputs) == 25
    # Adding the pool changes no other split.
    assert [r.unwrap() for r in plain.private_train] == [r.unwrap() for r in pooled.private_train]
    assert plain.test == pooled.test and plain.public_examples == pooled.public_examples
    # Public messages: placeholders, no fake personal data, none of the private or test texts.
    private_texts = {r.unwrap().text for r in pooled.private_train} | {e.text for e in pooled.test}
    assert not private_texts & set(pooled.public_inputs)
    assert not any(name in text.split() for text in pooled.public_inputs for name in FIRST_NAMES)
    # A function of the seed alone (the pool does not depend on how many private records there are).
    assert make_support_task(seed=2, n_private=10, n_test=3, public_inputs=25).public_inputs == pooled.public_inputs
    assert make_support_task(seed=3, public_inputs=25).public_inputs != pooled.public_inputs
    with pytest.raises(ValueError, match="public_inputs: must be an integer >= 0"):
        make_support_task(public_inputs=-1)


def benchmark_data() -> Path:
    from dp_textgrad.tasks.loaders import resolve_data_dir

    try:
        root = resolve_data_dir(None)
    except (FileNotFoundError, ValueError):
        pytest.skip("benchmark data not found; set DP_TEXTGRAD_DATA")
    if not (root / "sst2" / "train.tsv").is_file() or not (root / "banking77" / "dev.tsv").is_file():
        pytest.skip(f"SST-2 / BANKING77 data not found under {root}; set DP_TEXTGRAD_DATA")
    return root


def test_the_benchmark_tasks_take_a_pool_apart_from_their_private_and_test_records() -> None:
    from dp_textgrad.tasks.registry import get_task

    benchmark_data()
    for name, options in (("sst2", dict(n_private=300, n_test=50)), ("banking77", dict(n_private=300, n_test=50))):
        plain = get_task(name, **options)
        pooled = get_task(name, public_inputs=30, **options)
        assert plain.public_inputs == [] and len(pooled.public_inputs) == 30, name
        # The pool changes no other split, and holds none of their records.
        assert [r.unwrap() for r in plain.private_train] == [r.unwrap() for r in pooled.private_train], name
        assert plain.test == pooled.test, name
        if name == "banking77":  # another split: disjoint by construction
            held = {r.unwrap().text for r in pooled.private_train} | {e.text for e in pooled.test}
            assert not held & set(pooled.public_inputs), name
        assert get_task(name, public_inputs=30, **options).public_inputs == pooled.public_inputs  # seeded
    with pytest.raises(ValueError, match="public_inputs: must be an integer >= 0"):
        get_task("sst2", public_inputs=-2)


def test_a_federated_run_refuses_a_labelling_phase() -> None:
    from pydantic import ValidationError

    from dp_textgrad.federated.config import FederatedSettings

    with pytest.raises(ValidationError, match="dp.labelling: federated runs have no labelling phase yet"):
        FederatedSettings.model_validate({"dp": {"labelling": {"teachers": 4}}})
