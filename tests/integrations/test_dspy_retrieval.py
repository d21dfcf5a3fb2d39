"""Retrieval over a public corpus in a program DPES compiles (issue 49, item 2).

- **The check.** A retriever (``dspy.retrievers.Embeddings``, a ``dspy.Embedder``, a plain
  callable the program holds) is refused, by path and kind, until the user declares it public;
  a declared one is accepted. Retrievers that call out or keep their index on disk are refused
  even when declared (``dspy.Retrieve`` through ``dspy.settings.rm``, DSPy's remote retrievers,
  the local ColBERT index), and a hosted embedder or a ColBERTv2 server only passes when also
  marked remote. A program with only ``aforward`` is refused, naming ``forward``.
- **The seal.** A sealed copy of the program, run on a private query, leaves no trace of it in
  DSPy's cache (memory and disk), in a memoised retriever's cache or in the retriever's queue,
  even outside a private call; the same program unsealed, run inside a private call, puts the
  query's embedding in DSPy's cache (DSPy's ``Embeddings`` searches in a worker thread of its
  own, outside the private call). A sealed hosted embedder asks litellm for no cache. The user's
  own program is unchanged by sealing.

The embedder is a deterministic bag-of-words hash (no model); the corpus is the help-centre
articles that ship with the package. Seconds, no network.
"""

from __future__ import annotations

import copy
import functools
import os
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # importing DSPy fetches nothing (as import_dspy)
dspy = pytest.importorskip("dspy", reason="needs the [dspy] extra: pip install -e '.[dspy]'")

from dp_textgrad.dp_es.config import ConfigError  # noqa: E402
from dp_textgrad.integrations.dspy.program_task import private_call  # noqa: E402
from dp_textgrad.integrations.dspy.retrieval import (  # noqa: E402
    cached_private_queries,
    check_retrieval,
    retrieval_parts,
    seal_retrieval,
    sealed_parts,
)
from dp_textgrad.tasks.help_centre import (  # noqa: E402
    HELP_CENTRE_FILE,
    hashed_word_embedder,
    help_centre_articles,
    help_centre_records,
)

PRIVATE_QUERY = "zqprivquery Amara Okafor says her card was stolen on the train"
OTHER_PRIVATE_QUERY = "zqprivother my router light is flashing orange since Tuesday"


#: A tiny deterministic embedder (words hashed into buckets, counted): no model to download.
bag_of_words = hashed_word_embedder(256)


def help_centre_retriever(**kwargs: Any) -> Any:
    return dspy.retrievers.Embeddings(
        corpus=help_centre_articles(),
        embedder=dspy.Embedder(bag_of_words),
        k=2,
        brute_force_threshold=100_000,
        **kwargs,
    )


@functools.cache
def keyword_search(query: str) -> tuple[str, ...]:
    """A plain callable retriever, memoised: it would keep every query it is called with."""
    words = set(query.lower().split())
    return tuple(text for text in help_centre_articles() if words & set(text.lower().split()))[:2]


class Hop(dspy.Module):
    def __init__(self) -> None:
        super().__init__()
        self.search = keyword_search
        self.note = dspy.Predict("context, question -> note")


class HelpDesk(dspy.Module):
    """A RAG program: retrieve help-centre articles, then answer; a nested hop holds a callable."""

    def __init__(self, retrieve: Any | None = None) -> None:
        super().__init__()
        self.retrieve = retrieve if retrieve is not None else help_centre_retriever()
        self.hop = Hop()
        self.answer = dspy.ChainOfThought("context, question -> answer")

    def forward(self, question: str) -> Any:  # the retrieval steps only: no LM is needed here
        found = self.retrieve(question)
        extra = self.hop.search(question)
        return dspy.Prediction(passages=found.passages, indices=found.indices, extra=list(extra))


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """DSPy's two-level cache as ``dspy.cache``, its disk tier in ``tmp_path``; undone after."""
    monkeypatch.setenv("DSPY_CACHEDIR", str(tmp_path / "default_cache"))
    cache = dspy.clients.Cache(enable_disk_cache=True, enable_memory_cache=True, disk_cache_dir=str(tmp_path / "c"))
    monkeypatch.setitem(vars(dspy), "cache", cache)
    keyword_search.cache_clear()
    yield cache
    cache.disk_cache.close()


def cache_keys(cache: Any) -> set[str]:
    return set(cache.memory_cache) | set(iter(cache.disk_cache))


# -- the corpus ---------------------------------------------------------------------------------------
def test_the_help_centre_corpus_ships_with_the_package() -> None:
    records = help_centre_records()
    assert 40 <= len(records) <= 45
    assert len({r.id for r in records}) == len(records)
    assert {r.id.split("-")[0] for r in records} == {"bill", "tech", "cancel", "fraud", "update"}
    for record in records:
        assert record.title and record.text
        sentences = [s for s in record.text.replace("?", ".").split(". ") if s.strip()]
        assert 2 <= len(sentences) <= 4, record.id
        assert "{" not in record.text and "[" not in record.text  # no template slots, no placeholders
    assert help_centre_articles()[0] == f"{records[0].title}: {records[0].text}"
    # packaged: the file is read through importlib.resources, and pyproject's package data names it
    assert resources.files("dp_textgrad.tasks").joinpath(HELP_CENTRE_FILE).is_file()
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["dp_textgrad.tasks"]
    assert any(Path(HELP_CENTRE_FILE).match(pattern) for pattern in patterns)


# -- what a program holds -----------------------------------------------------------------------------
def test_retrieval_parts_names_each_part_by_its_path() -> None:
    program = HelpDesk()
    program.lm_of_mine = dspy.utils.DummyLM([{"answer": "x"}])  # an LM: not a retriever
    program.helpers = {"rank": sorted, "again": functools.partial(keyword_search)}  # a builtin is not one
    program.own_method = program.forward  # the program's own code, not a retriever
    parts = dict(retrieval_parts(program))
    assert list(parts) == ["retrieve", "retrieve.embedder", "hop.search", "helpers[again]"]
    assert parts["retrieve"] is program.retrieve
    assert parts["retrieve.embedder"] is program.retrieve.embedder
    assert parts["hop.search"] is keyword_search


# -- the check ----------------------------------------------------------------------------------------
def test_an_undeclared_retriever_is_refused_by_path_and_kind() -> None:
    with pytest.raises(ConfigError) as refused:
        check_retrieval(HelpDesk(), [])
    message = str(refused.value)
    assert "retrieve (a dspy.retrievers.Embeddings) is not declared public" in message
    assert "public_retrievers=['retrieve']" in message
    assert "hop.search (a callable, keyword_search)" in message
    with pytest.raises(ConfigError, match=r"hop\.search"):
        check_retrieval(HelpDesk(), ["retrieve"])


def test_a_declared_retriever_is_accepted() -> None:
    check_retrieval(HelpDesk(), ["retrieve", "hop.search"])
    check_retrieval(HelpDesk(), ["self.retrieve", "hop"])  # a module's path covers the parts under it
    check_retrieval(dspy.ChainOfThought("question -> answer"), [])  # no retrieval at all


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        (["retreive", "hop"], r"public_retrievers: 'retreive' names no retrieval part.*retrieve \(a dspy"),
        ("retrieve", r"public_retrievers: expected a list of part paths"),
        ([3], r"public_retrievers: each entry is a part's path"),
    ],
)
def test_a_declaration_that_names_nothing_is_refused(declared: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_retrieval(HelpDesk(), declared)


def local_colbert() -> Any:
    from dspy.dsp.colbertv2 import ColBERTv2RetrieverLocal

    return ColBERTv2RetrieverLocal.__new__(ColBERTv2RetrieverLocal)  # its constructor needs colbert


def remote_rm() -> Any:
    from dspy.retrievers.databricks_rm import DatabricksRM

    return DatabricksRM.__new__(DatabricksRM)  # its constructor asks Databricks for credentials


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: dspy.Retrieve(k=2),
            r"retrieve \(a dspy\.Retrieve\) is refused: it searches through dspy\.settings\.rm",
        ),
        (remote_rm, r"retrieve \(DatabricksRM, a dspy\.Retrieve\) is refused: it sends each private query to a remote"),
        (local_colbert, r"retrieve \(a ColBERTv2RetrieverLocal\) is refused: it keeps its index on disk"),
    ],
)
def test_retrievers_that_call_out_or_persist_are_refused_even_when_declared(make: Any, message: str) -> None:
    program = HelpDesk(retrieve=make())
    for remote in ([], ["retrieve"]):
        with pytest.raises(ConfigError, match=message):
            check_retrieval(program, ["retrieve", "hop"], remote_retrievers=remote)


def hosted_embeddings() -> Any:
    retriever = help_centre_retriever()
    retriever.embedder = dspy.Embedder("openai/text-embedding-3-small")  # set after: building it would call out
    return retriever


@pytest.mark.parametrize(
    ("make", "path", "message"),
    [
        (
            hosted_embeddings,
            "retrieve.embedder",
            r"retrieve\.embedder \(a dspy\.Embedder of 'openai/text-embedding-3-small'\) calls out of the process: "
            r"each private query is sent to the hosted embedding model",
        ),
        (
            lambda: dspy.ColBERTv2(url="http://127.0.0.1", port=9),
            "retrieve",
            r"retrieve \(a dspy\.ColBERTv2\) calls out of the process: each private query is sent to the ColBERTv2",
        ),
    ],
)
def test_a_remote_retriever_passes_only_when_marked_remote(make: Any, path: str, message: str) -> None:
    program = HelpDesk(retrieve=make())
    with pytest.raises(ConfigError, match=message) as refused:
        check_retrieval(program, ["retrieve", "hop"])
    assert f"remote_retrievers=['{path}']" in str(refused.value)
    check_retrieval(program, ["retrieve", "hop"], remote_retrievers=[path])
    check_retrieval(program, ["retrieve", "hop"], remote_retrievers=["retrieve"])
    with pytest.raises(ConfigError, match=r"not declared public"):  # remote is not public
        check_retrieval(program, ["hop"], remote_retrievers=["retrieve"])


class AsyncOnly(dspy.Module):
    def __init__(self) -> None:
        super().__init__()
        self.answer = dspy.Predict("question -> answer")

    async def aforward(self, question: str) -> Any:
        return await self.answer.acall(question=question)


async def async_search(query: str) -> list[str]:
    return [query]


def test_async_programs_and_retrievers_are_refused_naming_the_sync_alternative() -> None:
    with pytest.raises(ConfigError, match=r"the program \(AsyncOnly\) defines only aforward.*give it a forward\(") as e:
        check_retrieval(AsyncOnly(), [])
    assert "module(...) in place of await module.acall(...)" in str(e.value)
    nested = HelpDesk()
    nested.hop.inner = AsyncOnly()
    with pytest.raises(ConfigError, match=r"student: hop\.inner \(AsyncOnly\) defines only aforward"):
        check_retrieval(nested, ["retrieve", "hop"])
    with_async = HelpDesk()
    with_async.hop.search = async_search
    with pytest.raises(ConfigError, match=r"hop\.search \(a callable, async_search\) is refused: it is async"):
        check_retrieval(with_async, ["retrieve", "hop"])


# -- the seal -----------------------------------------------------------------------------------------
def sealed_template(program: Any) -> Any:
    """What SealedProgram does with the hooks: a deep copy with the sealed parts as its memo, sealed."""
    template = copy.deepcopy(program, sealed_parts(program))
    seal_retrieval(template)
    return template


def test_a_sealed_copy_leaves_no_private_query_in_any_cache(fresh_cache: Any) -> None:
    program = HelpDesk()  # building it embeds the public corpus through DSPy's cache
    public_keys = cache_keys(fresh_cache)
    assert public_keys

    # control: the program as it is, run inside a private call, caches the query's embedding
    with private_call():
        plain = program(question=PRIVATE_QUERY)
    assert plain.passages[0].startswith("Lost or stolen card")
    leaked = cached_private_queries(program, [PRIVATE_QUERY])
    assert ("dspy.cache (memory)", PRIVATE_QUERY) in leaked
    assert ("dspy.cache (disk)", PRIVATE_QUERY) in leaked
    assert keyword_search.cache_info().currsize == 1

    # sealed: neither DSPy's cache nor the memoised retriever gets the other private query,
    # inside a private call or outside one (the seal does not rely on the call's gate)
    keys_before, memo_before = cache_keys(fresh_cache), keyword_search.cache_info()
    template = sealed_template(program)
    with private_call():
        inside = copy.deepcopy(template)(question=OTHER_PRIVATE_QUERY)
    outside = template(question=OTHER_PRIVATE_QUERY)
    assert inside.passages[0].startswith("Router light flashing orange or red")
    assert outside.passages == inside.passages and outside.extra == inside.extra
    assert cache_keys(fresh_cache) == keys_before
    assert keyword_search.cache_info() == memo_before
    assert cached_private_queries(template, [OTHER_PRIVATE_QUERY]) == []
    assert cached_private_queries(program, [OTHER_PRIVATE_QUERY]) == []
    # the same results as the program itself gives (run after, it caches the query: the control again)
    assert program(question=OTHER_PRIVATE_QUERY).passages == inside.passages
    assert ("dspy.cache (memory)", OTHER_PRIVATE_QUERY) in cached_private_queries(program, [OTHER_PRIVATE_QUERY])


#: DSPy's own ``Module.deepcopy`` tries a deep copy of the retriever's search thread first; the half-made
#: copy it drops complains when collected (``Unbatchify.__del__``). ``sealed_parts`` avoids that copy.
DSPY_DEEPCOPY_NOISE = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@DSPY_DEEPCOPY_NOISE
def test_the_seal_also_covers_a_copy_made_by_dspy_and_is_shared_by_per_call_copies(fresh_cache: Any) -> None:
    program = HelpDesk()
    template = program.deepcopy()  # DSPy's copy (its search thread cannot be deep-copied): a shallow copy
    assert template.retrieve is not program.retrieve
    seal_retrieval(template)
    seal_retrieval(template)  # idempotent
    keys_before = cache_keys(fresh_cache)
    result = template(question=PRIVATE_QUERY)
    assert result.passages[0].startswith("Lost or stolen card")
    assert cache_keys(fresh_cache) == keys_before
    assert keyword_search.cache_info().currsize == 0
    per_call = copy.deepcopy(template)  # each private call runs a deep copy of the template
    assert per_call.retrieve is template.retrieve and per_call.retrieve.embedder is template.retrieve.embedder
    assert isinstance(template.retrieve, dspy.retrievers.Embeddings)
    assert isinstance(template.retrieve.embedder, dspy.Embedder)
    assert template.retrieve.embedder.caching is False
    assert template.hop.search is keyword_search.__wrapped__


@DSPY_DEEPCOPY_NOISE
def test_sealing_leaves_the_users_program_unchanged(fresh_cache: Any) -> None:
    program = HelpDesk()
    shared = program.hop  # a sub-module the template may share: it must not be changed in place
    before = {
        "program": dict(vars(program)),
        "retrieve": dict(vars(program.retrieve)),
        "embedder": dict(vars(program.retrieve.embedder)),
        "hop": dict(vars(program.hop)),
    }
    search_thread = program.retrieve.search_fn
    templates = [sealed_template(program)]
    fallback = program.deepcopy()
    fallback.hop = shared  # the worst case: the template holds the user's own sub-module
    seal_retrieval(fallback)
    templates.append(fallback)
    assert dict(vars(program)) == before["program"]
    assert dict(vars(program.retrieve)) == before["retrieve"]
    assert dict(vars(program.retrieve.embedder)) == before["embedder"]
    assert dict(vars(program.hop)) == before["hop"] and program.hop is shared
    assert type(program.retrieve) is dspy.retrievers.Embeddings and type(program.retrieve.embedder) is dspy.Embedder
    assert program.retrieve.search_fn is search_thread and program.retrieve.embedder.caching is True
    assert program.hop.search is keyword_search
    for template in templates:
        assert template.retrieve is not program.retrieve
        assert template.retrieve.embedder is not program.retrieve.embedder
        assert template.hop is not shared and template.hop.search is keyword_search.__wrapped__
    # the user's program still runs as before, through DSPy's search thread and cache
    assert program(question=PRIVATE_QUERY).passages[0].startswith("Lost or stolen card")
    assert keyword_search.cache_info().currsize == 1


class FakeLiteLLM:
    """Stands in for litellm's embedding call: records what it is asked, answers bag-of-words vectors."""

    def __init__(self) -> None:
        self.cache = object()  # a configured litellm cache: a caching call would use it
        self.asked: list[bool] = []

    def embedding(self, model: str, input: list[str], caching: bool = False, **kwargs: Any) -> Any:  # noqa: A002
        self.asked.append(caching)
        return type("Response", (), {"data": [{"embedding": row.tolist()} for row in bag_of_words(input)]})()


def test_a_sealed_hosted_embedder_asks_for_no_cache(fresh_cache: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeLiteLLM()
    monkeypatch.setattr("dspy.clients.embedding._get_litellm", lambda: fake)
    program = HelpDesk(retrieve=hosted_embeddings())
    check_retrieval(program, ["retrieve", "hop"], remote_retrievers=["retrieve"])
    keys_before = cache_keys(fresh_cache)
    template = sealed_template(program)
    assert template(question=PRIVATE_QUERY).passages[0].startswith("Lost or stolen card")
    template.retrieve.embedder([PRIVATE_QUERY], caching=True)  # a call that asks for the cache does not get it
    assert fake.asked == [False, False]
    assert cache_keys(fresh_cache) == keys_before
    program.retrieve.embedder([PRIVATE_QUERY])  # control: the user's embedder caches, in litellm and DSPy
    assert fake.asked[-1] is True and cache_keys(fresh_cache) != keys_before
