"""Children of multi-part prompts (:mod:`dp_textgrad.tasks.components`): one part edited per child.

A :class:`ComponentMutationEngine` holds one :class:`MutationEngine` per part, each with that
part's public description and demonstrations. A child takes its primary parent's text and
replaces ONE part with a child of that part (a crossover mixes the same part of two parents).
Which part: round robin over the children of a generation, starting at a part that moves with
the generation (public, so a run replays exactly), as GEPA's round-robin component selector does.
The DP feedback (the failure histogram of the whole program) goes to every part's operators.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from dp_textgrad.dp_es.mutation.barrier import Feedback
from dp_textgrad.dp_es.mutation.mutation_engine import MutationEngine
from dp_textgrad.dp_es.population import Candidate
from dp_textgrad.privacy.data import PublicText
from dp_textgrad.tasks.components import join_components, split_components


class ComponentMutationEngine:
    """Makes children of multi-part prompts from public information only (module docstring).

    ``engines``: part name -> the MutationEngine of that part, in the parts' order."""

    critique = None  # the critique pipeline reads whole prompts; a multi-part run asks for none

    def __init__(self, engines: Mapping[str, MutationEngine]) -> None:
        if not engines:
            raise ValueError("engines: give one MutationEngine per part")
        self.engines = dict(engines)
        self.order = list(engines)

    def parts(self, candidate: Candidate) -> dict[str, str]:
        """``candidate``'s parts by name."""
        return split_components(candidate.text, self.order)

    def _part(self, candidate: Candidate, name: str) -> Candidate:
        """``candidate`` seen as a prompt of one part (same id: the part's children name it as parent)."""
        return Candidate(
            id=candidate.id,
            text=self.parts(candidate)[name],
            parent_ids=candidate.parent_ids,
            operator=candidate.operator,
            generation=candidate.generation,
            unsafe=candidate.unsafe,
        )

    def _whole(self, child: Candidate, name: str, by_id: Mapping[str, Candidate], generation: int) -> Candidate:
        """The multi-part child: its primary parent's parts with ``name`` replaced by ``child``'s text."""
        primary = by_id[child.parent_ids[0]]
        texts = self.parts(primary)
        texts[name] = child.text
        return Candidate.new(
            join_components(texts, self.order),
            generation=generation,
            operator=child.operator,
            parent_ids=child.parent_ids,
            operator_meta={"component": name, **child.operator_meta},
            unsafe=child.unsafe or primary.unsafe,
        )

    def _spread(
        self,
        parents: Sequence[Candidate],
        n: int,
        generation: int,
        exclude: Collection[str],
        make: Callable[[MutationEngine, list[Candidate], int, str], list[Candidate]],
    ) -> list[Candidate]:
        """Up to ``n`` distinct children, the parts taken round robin from one that moves with
        ``generation``; a part that gives no (new) child yields its turn to the next."""
        by_id = {parent.id: parent for parent in parents}
        seen = {parent.key for parent in parents} | set(exclude)
        out: list[Candidate] = []
        start = generation % len(self.order)
        rotation = self.order[start:] + self.order[:start]
        active = list(rotation)
        misses = dict.fromkeys(rotation, 0)
        turn = 0
        while len(out) < n and active:
            name = active[turn % len(active)]
            made = make(self.engines[name], [self._part(p, name) for p in parents], generation, name)
            fresh = [c for c in (self._whole(child, name, by_id, generation) for child in made) if c.key not in seen]
            if not fresh:
                misses[name] += 1
                if not made or misses[name] >= 3:  # nothing applies to this part, or it keeps repeating
                    active.remove(name)
                continue
            seen.add(fresh[0].key)
            out.append(fresh[0])
            turn += 1
        return out

    # -- the MutationEngine interface the generation step and the warm-up use ---------------
    def variants(self, seed: Candidate, n: int, generation: int = 0) -> list[Candidate]:
        """``n`` distinct variants of the seed (the initial population), one part changed each:
        the parts take turns, each with its own structured start (:meth:`MutationEngine.variants`)."""
        pools: dict[str, list[Candidate]] = {}

        def make(engine: MutationEngine, parts: list[Candidate], gen: int, name: str) -> list[Candidate]:
            if name not in pools:
                pools[name] = engine.variants(parts[0], n, generation=gen)
            return [pools[name].pop(0)] if pools[name] else []

        return self._spread([seed], n, generation, (), make)

    def offspring(
        self, parents: Sequence[Candidate], n: int, generation: int, dp_feedback: Mapping[str, Sequence[PublicText]]
    ) -> list[Candidate]:
        """Children of the chosen ``parents``; each part's engine sanitises the DP feedback and
        writes its children from it (:meth:`MutationEngine.offspring`)."""
        make = self._parents_in_turn(lambda engine, ordered, gen: engine.offspring(ordered, 1, gen, dp_feedback))
        return self._spread(list(parents), n, generation, (), make)

    def children(
        self,
        parents: Sequence[Candidate],
        n: int,
        generation: int,
        feedback: Feedback = (),
        exclude: Collection[str] = (),
    ) -> list[Candidate]:
        """Up to ``n`` distinct children (:meth:`MutationEngine.children`), one part edited each."""
        make = self._parents_in_turn(lambda engine, ordered, gen: engine.children(ordered, 1, gen, feedback=feedback))
        return self._spread(list(parents), n, generation, exclude, make)

    @staticmethod
    def _parents_in_turn(
        one_child: Callable[[MutationEngine, list[Candidate], int], list[Candidate]],
    ) -> Callable[[MutationEngine, list[Candidate], int, str], list[Candidate]]:
        """A ``make`` for :meth:`_spread` whose calls take the parents in turn as the primary one
        (best first, as :meth:`MutationEngine.children` does), the others as crossover partners."""
        turn = [0]

        def make(engine: MutationEngine, parts: list[Candidate], generation: int, name: str) -> list[Candidate]:
            primary = parts[turn[0] % len(parts)]
            turn[0] += 1
            return one_child(engine, [primary] + [p for p in parts if p.id != primary.id], generation)

        return make


def part_renderer(part: Any, fallback: Callable[[Any], str]) -> Callable[[Any], str]:
    """How a public example of ``part`` becomes demonstration text: the part's own renderer of
    the example's payload, else ``fallback`` (the task's)."""

    def render(example: Any) -> str:
        payload = getattr(example, "payload", None)
        if part.render_example is not None and payload is not None:
            return str(part.render_example(payload))
        return fallback(example)

    return render


def component_engines(
    components: Sequence[Any],
    build: Callable[[Any], MutationEngine],
) -> ComponentMutationEngine:
    """A :class:`ComponentMutationEngine` with ``build(part)`` as each part's engine."""
    return ComponentMutationEngine({part.name: build(part) for part in components})


__all__ = ["ComponentMutationEngine", "component_engines", "part_renderer"]
