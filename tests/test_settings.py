"""The run file's sections build what they name (``dp_textgrad.settings``): one way to make a
task, an engine and a Ray scoring pool, shared by the CLI, federated runs and deployments."""

from __future__ import annotations

import os
import pickle

import pytest

from dp_textgrad.settings import DEFAULT_FILE_SEED_PROMPT, DistributedSection, EngineSection, TaskSection


def write_csv(path, rows) -> None:
    path.write_text("text,label\n" + "".join(f"{text},{label}\n" for text, label in rows), encoding="utf-8")


def test_the_task_section_builds_a_built_in_task_or_the_users_files(tmp_path) -> None:
    built_in = TaskSection(name="support", options={"n_private": 40, "seed": 3}).build()
    assert len(built_in.private_train) == 40 and "bill" in built_in.labels
    rows = [("refund my card", "bill"), ("the app crashes", "tech"), ("charge twice", "bill"), ("login fails", "tech")]
    write_csv(tmp_path / "train.csv", rows)
    write_csv(tmp_path / "test.csv", rows)
    files = TaskSection(train=tmp_path / "train.csv", test=tmp_path / "test.csv", description="Support messages.")
    task = files.build()
    assert task.labels == ["bill", "tech"] and len(task.private_train) == 4
    assert task.seed_prompt == DEFAULT_FILE_SEED_PROMPT  # the files' default start
    with pytest.raises(ValueError, match="task.options: not accepted by the task builder"):
        TaskSection(name="support", options={"no_such_option": 1}).build()


def test_the_engine_section_builds_its_engine_through_the_registry() -> None:
    engine = EngineSection(kind="openai", model="some-model", base_url="http://127.0.0.1:9/v1", mode="completions",
                           options={"max_retries": 0}).build()  # nothing is contacted when it is built
    from dp_textgrad.engines.openai_engine import OpenAIEngine

    assert isinstance(engine, OpenAIEngine) and engine.model_string == "some-model"
    with pytest.raises(ValueError, match="engine.options: not accepted by the openai engine"):
        EngineSection(kind="openai", model="m", options={"no_such_option": 1}).build()


def test_the_distributed_section_builds_a_pool_whose_actors_build_the_engine_section(monkeypatch) -> None:
    local = EngineSection(options={"n_ctx": 512})
    pool = DistributedSection(actors=2, max_restarts=1).build(local)
    assert pool.actors == 2 and pool.max_restarts == 1 and pool.address is None
    factory = pickle.loads(pickle.dumps(pool.engine_factory))  # it travels to the actors (EngineSection.factory)
    built = []

    def build_engine(kind, **settings):
        built.append((kind, settings))
        return "the engine"

    from dp_textgrad.engines import registry

    monkeypatch.setattr(registry, "build_engine", build_engine)  # what EngineSection.build calls
    assert factory() == "the engine"
    # The local model's threads are this machine's cores shared out between the actors.
    threads = max(1, (os.cpu_count() or 1) // 2)
    assert built == [("llama_cpp", {"model": None, "base_url": None, "mode": None, "n_ctx": 512,
                                    "n_threads": threads})]
    assert local.options == {"n_ctx": 512}  # the run's own section is left as it was
    DistributedSection(actors=2).build(EngineSection(options={"n_threads": 3})).engine_factory()
    assert built[1][1]["n_threads"] == 3  # given threads are kept


def test_optimize_distributed_gets_its_pool_from_the_distributed_section(tmp_path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from dp_textgrad import cli
    from tests.test_cli import scripted

    asked = []

    def pool(section: DistributedSection, engine: EngineSection) -> None:
        asked.append((section.actors, engine))
        return None  # scores in this process: the test is about which road makes the pool

    monkeypatch.setattr(EngineSection, "build", lambda section: scripted())
    monkeypatch.setattr(DistributedSection, "build", pool)
    result = CliRunner().invoke(cli.app, ["optimize", "--task", "support", "--distributed", "--actors", "3",
                                          "--generations", "1", "--population", "3", "--epsilon", "2",
                                          "--runs-root", str(tmp_path / "runs")])
    assert result.exit_code in (0, cli.EXIT_STOPPED_EARLY), result.output
    assert asked == [(3, EngineSection())]
