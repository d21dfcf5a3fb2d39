"""DP answers on the real local model (Gemma 3 270M through llama.cpp): the engine's next-token
views the token vote asks for, and ``dp-textgrad optimize`` on the built-in generation task with a
public unlabelled pool and no public labelled example, its ledger equal to the plan atom for atom."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dp_textgrad.cli import app
from dp_textgrad.dp_es.config import DPESConfig
from dp_textgrad.dp_es.plan import RunPlan
from dp_textgrad.privacy.accounting.serialize import event_to_dict
from dp_textgrad.privacy.token_voting import AnsweringPlan
from dp_textgrad.tasks.registry import get_task

CONTEXT = "Message: Hello, my account number is AC-7805800 and my card was declined.\nAnswer:"


def test_the_top_next_pieces_are_the_model_s_ranking_and_do_not_depend_on_earlier_calls(llama_engine) -> None:
    first = llama_engine.top_next_pieces("Read the message.\n\n", CONTEXT, 8)
    assert len(first) == 8 and len(set(first)) == 8 and all(first)
    greedy = llama_engine.generate("Read the message.\n\n" + CONTEXT, max_tokens=1)
    assert greedy and first[0] == greedy  # the most likely token is the greedy one
    llama_engine.score_choices_batch("Something else entirely.\n\n", ["Input: x\nOutput:"], [" a", " b"])
    assert llama_engine.top_next_pieces("Read the message.\n\n", CONTEXT, 8) == first
    scores = llama_engine.score_choices_batch("Read the message.\n\n", [CONTEXT], first)[0]
    assert scores.argmax() == 0  # the scorer reads the same row: the same most likely token


def test_text_pieces_spell_the_text(llama_engine) -> None:
    text = " customer number 2970-6481-21, AC-7805800"
    pieces = llama_engine.text_pieces(text)
    assert "".join(pieces) == text
    assert len(pieces) == llama_engine.count_tokens(text)


@pytest.mark.parametrize("vote", ["token", "span"])
def test_optimize_answers_then_searches_on_the_local_model_and_the_ledger_is_the_plan(tmp_path: Path, vote) -> None:
    pytest.importorskip("llama_cpp", reason="needs the [local] extra: pip install 'dp-textgrad[local]'")
    config = tmp_path / "run.yaml"
    config.write_text(
        "task:\n  name: support_extract\n"
        "  options: {n_private: 120, n_public: 0, n_test: 4, public_inputs: 2}\n"
        "engine:\n  options: {n_ctx: 1024}\n"
        "dp:\n  epsilon: 4.0\n  generations: 1\n  population: 2\n  parents: 1\n  dataset_size: 120\n"
        "  sampling_rate: 0.05\n  insecure_noise_seed: 2\n"
        f"  labelling: {{queries: 2, teachers: 6, max_answer_tokens: 14, vote: {vote}}}\n"
        f"output:\n  runs_root: {(tmp_path / 'runs').as_posix()}\n",
        encoding="utf-8",
    )
    result = CliRunner().invoke(app, ["optimize", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert "DP answers: " in result.output and "public inputs answered" in result.output
    (run_dir,) = [p for p in (tmp_path / "runs").glob("run-*") if p.is_dir()]
    released = DPESConfig(**json.loads((run_dir / "config.json").read_text(encoding="utf-8"))["config"])
    plan = RunPlan.with_value(released, json.loads((run_dir / "checkpoint.json").read_text())["plan_value"])
    answering = plan.labelling(0)
    assert isinstance(answering, AnsweringPlan) and answering.mechanism.max_tokens == (14 if vote == "token" else 1)
    atoms = [*answering.events(), *plan.charges()]
    lines = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()[1:]]
    assert [line["event"] for line in lines] == [event_to_dict(e) for e in atoms]
    labels = json.loads((run_dir / "labels.json").read_text())
    assert labels["inputs"] == get_task("support_extract", n_private=120, n_public=0, n_test=4,
                                        public_inputs=2).public_inputs
    assert all("reference" in example for example in labels["examples"])
    if vote == "span":  # every answer a span of its input: the teachers' answers, voted whole
        assert all(example["reference"] in example["text"] for example in labels["examples"])
