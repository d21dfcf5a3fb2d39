"""Retrieval over a public corpus in a program ``DPES`` compiles.

A retriever in a DSPy program is called with text built from the private example (the query),
so it is part of the private call: what it does with the query must stay in the process, and
nothing of it may be kept once the call is over. Three functions:

- :func:`retrieval_parts`: the retrieval parts a program holds, with their paths: each
  ``dspy.retrievers.Embeddings`` (and the embedder it holds, ``<path>.embedder``), each
  ``dspy.Embedder``, DSPy's remote retrievers (``dspy.Retrieve`` and its subclasses,
  ``dspy.ColBERTv2``, the local ColBERT index), and each plain callable a program's own module
  holds as an attribute (``self.search = my_search``), which may be a retriever too.
- :func:`check_retrieval`: refuses, by path, kind and fix, a part the user has not declared in
  ``public_retrievers`` ("this part searches a corpus I declare public, in this process"), and,
  even when declared, a part that calls out of the process or keeps its index on disk. A hosted
  embedder (``dspy.Embedder("openai/...")``, through litellm) and a ColBERTv2 server get through
  only when also named in ``remote_retrievers`` ("its provider may see every private query, as
  my LM's provider does"). ``dspy.Retrieve`` (it searches through ``dspy.settings.rm``, a global
  the program does not hold), its subclasses (remote services reached through their own clients)
  and the local ColBERT index are never accepted. It also refuses a program that only runs
  asynchronously (:func:`check_sync_program`).
- :func:`seal_retrieval`: seals the retrieval parts of a private template of the program (a copy,
  never the user's own program): each ``Embeddings`` searches in the calling thread (DSPy's runs
  its searches in a worker thread of its own, outside the private call's context, where DSPy's
  cache and the logs are open), with a sealed embedder; each ``dspy.Embedder`` runs with caching
  off whatever a call asks (neither DSPy's cache, memory or disk, nor litellm's), and a callable
  memoised with ``functools.lru_cache``/``functools.cache`` runs unmemoised. The sealed parts
  hold only public data (the corpus, its vectors) and are shared, not copied, by the per-call
  copies of the template. :func:`sealed_parts` gives them as the memo of the deep copy that makes
  the template, so that the copy never tries to copy DSPy's search thread.

How ``DPES`` uses them::

    check_retrieval(student, public_retrievers, remote_retrievers=remote_retrievers)  # in compile
    template = copy_sharing(program, {**held_lms, **sealed_parts(program)})           # SealedProgram
    seal_retrieval(template)

:func:`cached_private_queries` looks for queries in every cache these parts write to (DSPy's
cache, memory and disk; litellm's in-memory cache; an ``Embeddings``' pending search queue), for
tests and audits.

What stays the user's: a declared callable is run as it is (what it keeps, prints or sends is the
program's own code, as the program's ``forward`` is); an embedding model that is a local
callable (``SentenceTransformer(...).encode``) is trusted to run in this process and keep
nothing; litellm's own global callbacks see a remote embedder's queries.
"""

from __future__ import annotations

import copy
import functools
import inspect
import sys
import types
from collections.abc import Iterator, Sequence
from typing import Any

from dp_textgrad.dp_es.config import ConfigError
from dp_textgrad.integrations.dspy._env import import_dspy

#: The kinds :func:`part_kind` gives.
EMBEDDINGS = "dspy.retrievers.Embeddings"
EMBEDDER = "dspy.Embedder"
RETRIEVE = "dspy.Retrieve"
COLBERT = "dspy.ColBERTv2"
COLBERT_LOCAL = "ColBERTv2RetrieverLocal"
CALLABLE = "callable"

#: Attributes of a module that hold DSPy's own machinery, never a retriever.
_MODULE_MACHINERY = frozenset({"callbacks", "history"})

#: Why a kind is never accepted, declared or not.
NEVER = {
    RETRIEVE: (
        "it searches through dspy.settings.rm, a retriever the program does not hold, so what it does "
        "with a private query (a server, a disk index, a cache) cannot be checked or sealed; hold the retriever "
        "in the program instead, e.g. self.retrieve = dspy.retrievers.Embeddings(corpus=..., embedder=...)"
    ),
    COLBERT_LOCAL: (
        "it keeps its index on disk and searches it through the colbert library, whose files and logs are "
        "out of the seal's reach; use dspy.retrievers.Embeddings over the same passages, held in memory"
    ),
}


# -- what a program holds ---------------------------------------------------------------------
def _dspy_classes() -> dict[str, tuple[type, ...]]:
    dspy = import_dspy()
    colbert = import_dspy("dspy.dsp.colbertv2")
    return {
        EMBEDDINGS: (dspy.retrievers.Embeddings,),
        EMBEDDER: (dspy.Embedder,),
        RETRIEVE: (dspy.Retrieve,),
        COLBERT: (dspy.ColBERTv2,),
        COLBERT_LOCAL: (colbert.ColBERTv2RetrieverLocal, colbert.ColBERTv2RerankerLocal),
    }


def _from_dspy(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "dspy"


def _plain_callable(value: Any, dspy: Any) -> bool:
    """A callable a program's own module holds that may be a retriever: a function, a method, a
    ``functools.partial`` or a callable object of the user's; not a class, a DSPy object, a builtin
    or a method of a DSPy module (the program's own code)."""
    if isinstance(value, type) or not callable(value) or _from_dspy(value):
        return False
    if isinstance(value, (dspy.BaseModule, dspy.BaseLM, dspy.Adapter)):  # a user's LM or adapter class
        return False
    if isinstance(value, types.MethodType):
        return not isinstance(value.__self__, dspy.BaseModule)
    if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        return False
    return type(value).__module__ != "builtins" or isinstance(value, types.FunctionType)


def part_kind(part: Any) -> str | None:
    """The retrieval kind of ``part`` (``EMBEDDINGS``, ``EMBEDDER``, ``RETRIEVE``, ``COLBERT``,
    ``COLBERT_LOCAL``), ``CALLABLE`` for another callable, or None for a class or a non-callable."""
    for kind, classes in _dspy_classes().items():
        if isinstance(part, classes):
            return kind
    if callable(part) and not isinstance(part, type):
        return CALLABLE
    return None


def _describe(path: str, part: Any, kind: str) -> str:
    name = type(part).__name__
    if kind == CALLABLE:
        what = getattr(part, "__qualname__", None) or name
        return f"{path} (a callable, {what})"
    if kind == EMBEDDER:
        model = part.model
        shown = repr(model) if isinstance(model, str) else getattr(model, "__qualname__", type(model).__name__)
        return f"{path} (a dspy.Embedder of {shown})"
    base = kind.rsplit(".", 1)[-1]
    return f"{path} (a {kind})" if name == base else f"{path} ({name}, a {kind})"


def _walk(program: Any) -> Iterator[tuple[str, Any, str]]:
    """(path, part, kind) for each retrieval part, breadth first as ``named_sub_modules`` walks a
    program (each object once), with its paths (without ``self.``)."""
    dspy = import_dspy()
    classes = _dspy_classes()
    known = tuple(cls for group in classes.values() for cls in group)
    queue: list[tuple[str, Any, bool]] = [("self", program, False)]  # (path, item, held by a user module)
    seen = {id(program)}
    position = 0

    def add(path: str, item: Any, by_user: bool) -> None:
        if id(item) not in seen:
            seen.add(id(item))
            queue.append((path, item, by_user))

    while position < len(queue):
        path, item, by_user = queue[position]
        position += 1
        name = path.removeprefix("self.")
        if isinstance(item, known):
            kind = next(k for k, group in classes.items() if isinstance(item, group))
            yield name, item, kind
            if kind == EMBEDDINGS:
                embedder = getattr(item, "embedder", None)
                if embedder is not None and id(embedder) not in seen:
                    seen.add(id(embedder))
                    yield f"{name}.embedder", embedder, part_kind(embedder) or CALLABLE
        elif by_user and _plain_callable(item, dspy):
            yield name, item, CALLABLE
        if isinstance(item, dspy.BaseModule):
            own = not _from_dspy(item)
            for attribute, value in vars(item).items():
                if attribute not in _MODULE_MACHINERY:
                    add(f"{path}.{attribute}", value, own)
        elif isinstance(item, (list, tuple)):
            for index, value in enumerate(item):
                add(f"{path}[{index}]", value, by_user)
        elif isinstance(item, dict):
            for key, value in item.items():
                add(f"{path}[{key}]", value, by_user)


def retrieval_parts(program: Any) -> list[tuple[str, Any]]:
    """The retrieval parts of ``program`` with their paths (``named_sub_modules``' paths without
    ``self.``): ``Embeddings`` (then its embedder as ``<path>.embedder``), ``dspy.Embedder``,
    ``dspy.Retrieve`` and its subclasses, ``dspy.ColBERTv2``, the local ColBERT index, and the plain
    callables the program's own modules hold (in attributes, lists, tuples and dicts)."""
    return [(path, part) for path, part, _ in _walk(program)]


# -- the check --------------------------------------------------------------------------------
def check_sync_program(program: Any) -> None:
    """Refuse a program, or a module in it, that defines ``aforward`` and no ``forward``: ``DPES``
    runs the program as DSPy's optimizers do, synchronously (``program(**inputs)``)."""
    dspy = import_dspy()
    if not isinstance(program, dspy.BaseModule):
        return  # not a program at all: check_program says so
    for path, module in program.named_sub_modules():
        cls = type(module)
        if getattr(cls, "forward", None) is None and getattr(cls, "aforward", None) is not None:
            where = "the program" if path == "self" else path.removeprefix("self.")
            raise ConfigError(
                f"student: {where} ({cls.__name__}) defines only aforward (async); DPES runs the program "
                "synchronously, program(**inputs), as DSPy's optimizers do: give it a forward(...) that makes "
                "the same calls without await (module(...) in place of await module.acall(...)), and keep "
                "aforward for your own async calls"
            )


def _paths(value: Any, field: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ConfigError(f"{field}: expected a list of part paths, e.g. {field}=['retrieve'], got {value!r}")
    paths = list(value)
    bad = [p for p in paths if not isinstance(p, str) or not p.strip()]
    if bad:
        raise ConfigError(f"{field}: each entry is a part's path as a string, e.g. 'retrieve'; got {bad[0]!r}")
    return [p.strip().removeprefix("self.") for p in paths]


def _covers(declared: str, path: str) -> bool:
    """Whether the declared path names ``path`` or a module or container above it."""
    return path == declared or path.startswith((declared + ".", declared + "["))


def check_retrieval(
    program: Any,
    public_retrievers: Sequence[str] | None = (),
    *,
    remote_retrievers: Sequence[str] | None = (),
) -> None:
    """Refuse, with :class:`ConfigError` naming the part (path and kind), the reason and the fix,
    a retrieval part ``DPES`` cannot keep private (module docstring):

    - a part not covered by ``public_retrievers``: the paths (``"retrieve"``, ``"hop.search"``) of
      the parts the user declares as searching a PUBLIC corpus, in this process; a path covers the
      parts under it (``"retrieve"`` covers ``"retrieve.embedder"``);
    - ``dspy.Retrieve`` and its subclasses and the local ColBERT index (never accepted);
    - a hosted ``dspy.Embedder`` (a model name, called through litellm) or a ``dspy.ColBERTv2``
      (a server), unless also covered by ``remote_retrievers``: the user accepts that the
      provider sees every private query;
    - an async function held as a retriever, and a program that only has ``aforward``
      (:func:`check_sync_program`).

    A path in either list that names no retrieval part is refused too (a typo would otherwise
    leave a part undeclared)."""
    check_sync_program(program)
    public = _paths(public_retrievers, "public_retrievers")
    remote = _paths(remote_retrievers, "remote_retrievers")
    parts = list(_walk(program))
    for field, declared in (("public_retrievers", public), ("remote_retrievers", remote)):
        for entry in declared:
            if not any(_covers(entry, path) for path, _, _ in parts):
                found = ", ".join(_describe(p, part, k) for p, part, k in parts) or "none"
                raise ConfigError(f"{field}: {entry!r} names no retrieval part of the program; its parts: {found}")
    retrieve_forward = import_dspy().Retrieve.forward
    problems = []
    for path, part, kind in parts:
        described = _describe(path, part, kind)
        is_public = any(_covers(entry, path) for entry in public)
        is_remote = any(_covers(entry, path) for entry in remote)
        if kind == RETRIEVE and type(part).forward is not retrieve_forward:
            if _from_dspy(part):  # DatabricksRM, WeaviateRM, ...
                problems.append(
                    f"{described} is refused: it sends each private query to a remote service through its own "
                    "client, whose logs and caches are out of the seal's reach; use dspy.retrievers.Embeddings "
                    "over a public corpus held in memory"
                )
                continue
            kind = CALLABLE  # the user's own dspy.Retrieve with its own forward: declared like a callable
        if kind in NEVER:
            problems.append(f"{described} is refused: {NEVER[kind]}")
        elif kind == CALLABLE and _is_async(part):
            problems.append(
                f"{described} is refused: it is async (async def), and DPES runs the program synchronously; "
                "hold a sync function that does the same search"
            )
        elif not is_public:
            problems.append(
                f"{described} is not declared public: its queries are built from private examples; if it searches "
                f"a public corpus in this process and keeps nothing, declare it with public_retrievers=['{path}']"
            )
        elif _calls_out(part, kind) and not is_remote:
            problems.append(
                f"{described} calls out of the process: {_why_remote(kind)}; {_local_alternative(kind)}, or, if "
                "you accept that its provider sees every private query as your LM's provider does, mark it with "
                f"remote_retrievers=['{path}']"
            )
    if problems:
        raise ConfigError("student: " + "; ".join(problems))


def _is_async(part: Any) -> bool:
    call = part if inspect.isroutine(part) or isinstance(part, functools.partial) else type(part).__call__
    while isinstance(call, functools.partial):
        call = call.func
    return inspect.iscoroutinefunction(call)


def _calls_out(part: Any, kind: str) -> bool:
    return kind == COLBERT or (kind == EMBEDDER and isinstance(part.model, str))


def _why_remote(kind: str) -> str:
    if kind == COLBERT:
        return "each private query is sent to the ColBERTv2 server, which may log it"
    return "each private query is sent to the hosted embedding model (through litellm), whose provider may log it"


def _local_alternative(kind: str) -> str:
    if kind == COLBERT:
        return "search the same passages in this process with dspy.retrievers.Embeddings"
    return "use an embedder that runs here (dspy.Embedder(fn) with a local model, e.g. SentenceTransformer(...).encode)"


# -- the seal ---------------------------------------------------------------------------------
class _Shared:
    """A sealed part holds public data only: the per-call copies of a template share it."""

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return self


class _SealedEmbeddingsMixin(_Shared):
    """``Embeddings`` that searches in the calling thread (no worker thread, no queue)."""

    def search_fn(self, query: str) -> Any:
        return self._batch_forward([query])[0]  # type: ignore[attr-defined]


class _SealedEmbedderMixin(_Shared):
    """``dspy.Embedder`` with caching off whatever a call asks: neither DSPy's cache nor litellm's."""

    def __call__(self, inputs: Any, batch_size: int | None = None, caching: bool | None = None, **kwargs: Any) -> Any:
        return super().__call__(inputs, batch_size=batch_size, caching=False, **kwargs)  # type: ignore[misc]

    async def acall(
        self, inputs: Any, batch_size: int | None = None, caching: bool | None = None, **kwargs: Any
    ) -> Any:
        return await super().acall(inputs, batch_size=batch_size, caching=False, **kwargs)  # type: ignore[misc]


_sealed_classes: dict[tuple[type, type], type] = {}


def _sealed_class(base: type, mixin: type) -> type:
    found = _sealed_classes.get((base, mixin))
    if found is None:
        found = _sealed_classes[(base, mixin)] = type(f"Sealed{base.__name__}", (mixin, base), {})
    return found


def _sealed_instance(part: Any, mixin: type) -> Any:
    """A new object of ``part``'s sealed class with a shallow copy of its attributes."""
    sealed: Any = object.__new__(_sealed_class(type(part), mixin))
    vars(sealed).update(vars(part))
    return sealed


def unmemoised(fn: Any) -> Any:
    """``fn`` without its ``functools.lru_cache`` / ``functools.cache`` (which would keep each private
    query it is called with), as a function or a bound method; anything else as it is."""
    if isinstance(fn, types.MethodType):
        inner = unmemoised(fn.__func__)
        return fn if inner is fn.__func__ else types.MethodType(inner, fn.__self__)
    if callable(getattr(fn, "cache_info", None)) and callable(getattr(fn, "cache_clear", None)):
        wrapped = getattr(fn, "__wrapped__", None)
        if callable(wrapped):
            return unmemoised(wrapped)
    return fn


class _Sealer:
    """Seals the retrieval parts reachable from a template's attributes, copying (shallow) what
    holds a sealed part instead of changing it: a part shared with the user's program stays as it is."""

    def __init__(self) -> None:
        self._dspy = import_dspy()
        self._classes = _dspy_classes()
        self._done: dict[int, Any] = {}

    def embedder(self, embedder: Any) -> Any:
        if id(embedder) in self._done:
            return self._done[id(embedder)]
        sealed: Any
        if isinstance(embedder, _SealedEmbedderMixin):
            sealed = embedder
        elif isinstance(embedder, self._dspy.Embedder):
            sealed = _sealed_instance(embedder, _SealedEmbedderMixin)
            sealed.caching = False
            sealed.model = unmemoised(embedder.model)
        else:  # a plain callable (Embeddings accepts one)
            sealed = unmemoised(embedder)
        self._done[id(embedder)] = sealed
        return sealed

    def embeddings(self, embeddings: Any) -> Any:
        if id(embeddings) in self._done:
            return self._done[id(embeddings)]
        sealed = embeddings
        if not isinstance(embeddings, _SealedEmbeddingsMixin):
            sealed = _sealed_instance(embeddings, _SealedEmbeddingsMixin)
            vars(sealed).pop("search_fn", None)  # DSPy's Unbatchify: a worker thread outside the private call
            if getattr(embeddings, "embedder", None) is not None:
                sealed.embedder = self.embedder(embeddings.embedder)
        self._done[id(embeddings)] = sealed
        return sealed

    def fixed(self, item: Any, by_user: bool) -> Any:
        if id(item) in self._done:
            return self._done[id(item)]
        dspy = self._dspy
        if isinstance(item, self._classes[EMBEDDINGS]):
            result = self.embeddings(item)
        elif isinstance(item, self._classes[EMBEDDER]):
            result = self.embedder(item)
        elif by_user and _plain_callable(item, dspy):
            result = unmemoised(item)
        elif isinstance(item, (dspy.BaseModule, list, tuple, dict)):
            self._done[id(item)] = item  # a cycle back to an item being sealed finds the item itself
            result = self._container(item, by_user)
        else:
            result = item
        self._done[id(item)] = result
        return result

    def _container(self, item: Any, by_user: bool) -> Any:
        dspy = self._dspy
        if isinstance(item, dspy.BaseModule):
            own = not _from_dspy(item)
            changed = {
                name: new
                for name, part in vars(item).items()
                if name not in _MODULE_MACHINERY and (new := self.fixed(part, own)) is not part
            }
            if not changed:
                return item
            result = copy.copy(item)
            for name, new in changed.items():
                setattr(result, name, new)
            return result
        if type(item) is dict:  # a subclass of dict, list or tuple is left as it is
            entries = {key: self.fixed(part, by_user) for key, part in item.items()}
            return entries if any(entries[key] is not part for key, part in item.items()) else item
        if type(item) in (list, tuple):
            parts = [self.fixed(part, by_user) for part in item]
            return type(item)(parts) if any(new is not old for new, old in zip(parts, item)) else item
        return item


def seal_retrieval(template: Any) -> None:
    """Seal the retrieval parts of ``template``, a private copy of the user's program (module
    docstring), in place: its root's attributes are replaced; a sub-module, list or dict that holds
    a sealed part is replaced by a shallow copy, so that nothing the template shares with the user's
    program is changed. Parts that :func:`check_retrieval` refuses are left as they are."""
    sealer = _Sealer()
    own = not _from_dspy(template)
    for name, value in list(vars(template).items()):
        if name in _MODULE_MACHINERY:
            continue
        new = sealer.fixed(value, own)
        if new is not value:
            setattr(template, name, new)


def sealed_parts(program: Any) -> dict[int, Any]:
    """``{id(part): sealed part}`` for each retrieval part of ``program`` that sealing changes, to
    pass as the memo of the deep copy that makes the template (``copy.deepcopy(program, memo)``):
    the copy then holds the sealed parts and never tries to deep-copy an ``Embeddings``' search
    thread (which fails, so that DSPy falls back to a shallow copy with a warning). The user's parts
    are not changed. Sealing the copy with :func:`seal_retrieval` afterwards is still right (it
    leaves sealed parts as they are) and covers a copy made without the memo."""
    sealer = _Sealer()
    found: dict[int, Any] = {}
    for _, part, kind in _walk(program):
        if kind == EMBEDDINGS:
            sealed = sealer.embeddings(part)
        elif kind == EMBEDDER:
            sealed = sealer.embedder(part)
        elif kind == CALLABLE:
            sealed = unmemoised(part)
        else:
            continue
        if sealed is not part:
            found[id(part)] = sealed
    return found


# -- inspection -------------------------------------------------------------------------------
def _query_vectors(program: Any, queries: Sequence[str]) -> list[tuple[str, Any]]:
    """(query, vector) for each query under each in-process embedder of the program, computed
    with every cache off (the model itself, unmemoised). Hosted models are never called."""
    import numpy as np

    dspy = import_dspy()
    models: dict[int, Any] = {}
    for _, part, kind in _walk(program):
        embedder = part if kind == EMBEDDER else getattr(part, "embedder", None) if kind == EMBEDDINGS else None
        model = embedder.model if isinstance(embedder, dspy.Embedder) else embedder
        if callable(model) and not isinstance(model, str):  # a hosted model (a name) is never called
            models.setdefault(id(model), unmemoised(model))
    vectors: list[tuple[str, Any]] = []
    for model in models.values():
        rows = np.asarray(model(list(queries)), dtype=float)
        vectors.extend((query, row) for query, row in zip(queries, rows.reshape(len(queries), -1)))
    return vectors


def _holds(value: Any, query: str, vectors: list[Any], depth: int = 0) -> bool:
    """Whether ``value`` holds ``query``'s text or one of its ``vectors`` (raw or normalised)."""
    import numpy as np

    if depth > 6:
        return False
    if isinstance(value, str):
        return query in value
    if isinstance(value, bytes):
        return query.encode() in value
    if isinstance(value, dict):
        return any(
            _holds(k, query, vectors, depth + 1) or _holds(v, query, vectors, depth + 1) for k, v in value.items()
        )
    if vectors and isinstance(value, (list, tuple, np.ndarray)):
        try:
            rows = np.asarray(value, dtype=float)
        except (TypeError, ValueError):
            rows = None
        if rows is not None and rows.ndim in (1, 2) and rows.size:
            rows = rows.reshape(-1, rows.shape[-1])
            for vector in vectors:
                if vector.shape[-1] == rows.shape[-1]:
                    unit = vector / max(float(np.linalg.norm(vector)), 1e-10)
                    norms = np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-10)
                    if np.any(np.all(np.isclose(rows, vector), axis=1)) or np.any(
                        np.all(np.isclose(rows / norms, unit), axis=1)
                    ):
                        return True
            return False
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_holds(v, query, vectors, depth + 1) for v in value)
    found = getattr(value, "__dict__", None)
    if isinstance(found, dict) and depth < 3:
        return _holds(found, query, vectors, depth + 1)
    return False


def _cache_entries(program: Any) -> Iterator[tuple[str, Any]]:
    """(where, value) for each entry of each cache the retrieval parts write to."""
    dspy = sys.modules.get("dspy")
    cache = vars(dspy).get("cache") if dspy is not None else None  # not built yet: nothing cached
    if cache is not None:
        for key, value in list(getattr(cache, "memory_cache", {}).items()):
            yield "dspy.cache (memory)", (key, value)
        disk = getattr(cache, "disk_cache", {})
        for key in list(iter(disk)):  # a dict when the disk tier is off, else diskcache's FanoutCache
            yield "dspy.cache (disk)", (key, disk.get(key))
    litellm = sys.modules.get("litellm")
    litellm_cache = getattr(litellm, "cache", None) if litellm is not None else None
    inner = getattr(litellm_cache, "cache", None)
    for key, value in list(getattr(inner, "cache_dict", {}).items()):
        yield "litellm.cache (memory)", (key, value)
    for path, part, kind in _walk(program):
        pending = getattr(getattr(part, "search_fn", None), "input_queue", None) if kind == EMBEDDINGS else None
        if pending is not None:
            for entry in list(pending.queue):
                yield f"{path}.search_fn (queue)", entry


def cached_private_queries(program: Any, queries: Sequence[str]) -> list[tuple[str, str]]:
    """(cache, query) for each of ``queries`` that a cache the program's retrieval parts write to
    holds, as text or as its embedding under one of the program's in-process embedders: DSPy's
    cache (memory and disk; read without building it), litellm's in-memory cache, and the pending
    search queue of each ``Embeddings``. For tests and audits: it runs the in-process embedders on
    ``queries`` (with every cache off) to recognise their vectors. A callable's own
    ``functools.lru_cache`` does not show its keys: :func:`seal_retrieval` bypasses it instead."""
    queries = list(queries)
    vectors = _query_vectors(program, queries) if queries else []
    found: list[tuple[str, str]] = []
    for where, value in _cache_entries(program):
        for query in queries:
            mine = [vector for q, vector in vectors if q == query]
            if (where, query) not in found and _holds(value, query, mine):
                found.append((where, query))
    return found


__all__ = [
    "CALLABLE",
    "COLBERT",
    "COLBERT_LOCAL",
    "EMBEDDER",
    "EMBEDDINGS",
    "NEVER",
    "RETRIEVE",
    "cached_private_queries",
    "check_retrieval",
    "check_sync_program",
    "part_kind",
    "retrieval_parts",
    "seal_retrieval",
    "sealed_parts",
    "unmemoised",
]
