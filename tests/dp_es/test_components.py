"""Multi-part prompts (a DSPy program's predictors, a GEPA candidate's texts): one candidate text
holds every part under its header; each child edits exactly one part, with that part's own public
demonstrations; the run charges exactly its plan, as a one-part run does."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dp_textgrad
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.privacy.data import PrivateDataset
from dp_textgrad.tasks.components import PromptComponent, join_components, split_components
from dp_textgrad.tasks.scored import ScoredExample, ScoredTask
from tests.dp_es.test_generation_privacy import charges, planned_atoms

RUN = dict(
    epsilon=3.0,
    generations=3,
    population=4,
    parents=2,
    sampling_rate=0.5,
    insecure_noise_seed=3,
    seed=1,
    evaluate=False,
    dataset_size=40,
)
PARTS = ("extract", "normalise")


def records(n: int = 40) -> list[dict]:
    return [{"number": str(i), "answer": "odd" if i % 2 else "even"} for i in range(n)]


def two_part_score(prompt: str, record: dict) -> float:
    """Half a mark per part that shows a demonstration of its own kind (``E:`` or ``N:`` lines)."""
    parts = split_components(prompt, PARTS)
    return 0.5 * ("E: " in parts["extract"]) + 0.5 * ("N: " in parts["normalise"])


def two_part_task() -> ScoredTask:
    payloads = [{"number": "3", "answer": "odd"}, {"number": "4", "answer": "even"}, {"number": "7", "answer": "odd"}]

    def part(name: str, tag: str) -> PromptComponent:
        def render(payload: dict) -> str:
            return f"{tag}: {payload['number']} -> {payload['answer']}"

        return PromptComponent(
            name=name,
            seed=f"Do the {name} step.",
            description=f"The {name} step of a number pipeline.",
            public_examples=tuple(ScoredExample(text=render(p), payload=p) for p in payloads),
            render_example=render,
        )

    return ScoredTask(
        name="two-parts",
        description="A two-step number pipeline.",
        private_train=PrivateDataset(records()),
        test=[],
        score_record=two_part_score,
        components=(part("extract", "E"), part("normalise", "N")),
    )


@given(
    st.lists(
        st.text(alphabet=st.characters(blacklist_characters="[]", blacklist_categories=("Cs",)), max_size=30),
        min_size=2,
        max_size=2,
    )
)
def test_parts_round_trip_through_their_one_text(texts) -> None:
    joined = join_components(dict(zip(PARTS, texts)), PARTS)
    assert split_components(joined, PARTS) == {name: text.strip() for name, text in zip(PARTS, texts)}


def test_a_text_without_every_header_in_order_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\[\[extract\]\], \[\[normalise\]\]"):
        split_components("[[normalise]]\nb\n\n[[extract]]\na", PARTS)
    with pytest.raises(ValueError, match="header"):
        split_components("preamble\n[[extract]]\na\n[[normalise]]\nb", PARTS)
    with pytest.raises(ValueError, match="holds a header line"):
        join_components({"extract": "a\n[[normalise]]", "normalise": "b"}, PARTS)


def test_the_seed_is_every_part_seed_under_its_header() -> None:
    task = two_part_task()
    assert split_components(task.seed_prompt, PARTS) == {
        "extract": "Do the extract step.",
        "normalise": "Do the normalise step.",
    }


def test_each_child_edits_one_part_with_its_own_demonstrations_and_the_ledger_is_the_plan(tmp_path) -> None:
    outcome = dp_textgrad.optimize(two_part_task(), ScriptedEngine(), runs_root=tmp_path, llm_operators=False, **RUN)
    optimizer = outcome.optimizer
    archive = {c.id: c for c in optimizer.population.archive}
    children = [c for c in archive.values() if c.parent_ids and c.parent_ids[0] in archive]
    assert children
    edited_parts = set()
    for child in children:
        parent = archive[child.parent_ids[0]]
        mine, theirs = split_components(child.text, PARTS), split_components(parent.text, PARTS)
        changed = [name for name in PARTS if mine[name] != theirs[name]]
        assert changed == [child.operator_meta["component"]], (child.text, parent.text)
        edited_parts.add(changed[0])
        # a part's demonstrations are its own: no N: line in extract, no E: line in normalise
        assert "N: " not in mine["extract"] and "E: " not in mine["normalise"]
    assert edited_parts == set(PARTS)  # the parts take turns
    split_components(outcome.result.prompt, PARTS)  # the release is a whole multi-part prompt
    search = [c for c in charges(outcome.run_dir) if c["label"].startswith(("generation ", "final "))]
    assert search and [c["event"] for c in search] == planned_atoms(outcome.run_dir)


def test_components_need_distinct_names_and_a_seed_that_holds_them() -> None:
    task = two_part_task()
    with pytest.raises(ValueError, match="names must differ"):
        ScoredTask(**{**task.__dict__, "components": (task.components[0], task.components[0]), "seed_prompt": ""})
    with pytest.raises(ValueError, match="header lines"):
        ScoredTask(**{**task.__dict__, "seed_prompt": "one text for two parts"})
