"""L1 audit of a whole DP-ES controller loop (calibration, scoring, selection, feedback), run
thousands of times on a table task with the tests-only ScriptedEngine.

Part of the L1 mechanism audits described in :mod:`dp_textgrad.audit.mechanism_audits`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import Any, Literal

import dp_accounting
import numpy as np

from dp_textgrad.audit.mechanism_audits.trials import (
    MechanismAuditResult,
    NoiseOff,
    ScaledNoise,
    Trials,
    binary_bound,
)
from dp_textgrad.privacy.accounting import smallest_bound

_CANARY_TEXT = "audit canary record"
_TRAILING_TEXT = "audit baseline record 0"
_CANARY_RAW = 3.0  # the canary's raw score for the seed prompt, in units of C: above the clip bound on purpose


class _RecordingLedger:
    """Records every charged event; the claim is computed once from them afterwards.

    The real :class:`PrivacyLedger` re-runs five accountants on every spend (about
    0.25 s); the audit needs thousands of runs, so it records the events and asks the
    same accountants once. Every run must charge the same events (checked).
    """

    replayed = 0  # charges adopted on a resume: an audit never resumes

    def __init__(self, epsilon_budget: float, delta: float) -> None:
        self.epsilon_budget = epsilon_budget
        self.delta = delta
        self.events: list[dp_accounting.DpEvent] = []
        self.unsafe = False

    def spend(self, event: dp_accounting.DpEvent, label: str, metadata: Any = None) -> None:
        self.events.append(event)

    def epsilon(self) -> float:
        return math.nan  # not computed per run (see class docstring)

    def epsilons(self) -> dict[str, float]:
        return {}

    def mark_unsafe(self, reason: str) -> None:
        self.unsafe = True

    def declare_noise(self, sampler: str) -> None:
        pass  # the audit states its own (insecure, seeded) noise in its result


class _ReplayedVariants:
    """Generation 0's public variants, built once per audit and replayed in every run.

    They are a function of public inputs only (the seed prompt, the task's public text,
    the public generator's state) and, with the LLM operators off, call no engine: every
    run of the audit builds the same ones, at about three quarters of a run's cost.
    Replaying them and moving the run's public generator to where building them leaves
    it makes each run the run the library would do (tests/audit/test_audit_l1.py checks
    equal results with and without).
    """

    def __init__(self) -> None:
        self._built: dict[tuple[str, ...], tuple[list[Any], dict[str, Any]]] = {}

    def install(self, mutator: Any) -> None:
        build = mutator.variants

        def variants(seed: Any, n: int, generation: int = 0) -> list[Any]:
            key = (
                seed.text,
                str(n),
                str(generation),
                str(mutator.task_description),
                repr(mutator.labels),
                repr(mutator.rng.bit_generator.state),
            )
            if key not in self._built:
                self._built[key] = (copy.deepcopy(build(seed, n, generation)), mutator.rng.bit_generator.state)
            made, public_state = self._built[key]
            mutator.rng.bit_generator.state = public_state
            # Fresh candidates: a run adds evaluations to them (text and ids are immutable).
            return [
                dataclasses.replace(c, operator_meta=copy.deepcopy(c.operator_meta), evaluations=list(c.evaluations))
                for c in made
            ]

        mutator.variants = variants


def _audit_task(seed_prompt: str, n_background: int, clip_bound: float, trailing: bool = True) -> Any:
    """A tiny task whose per-record score is a table: the canary gives C to the seed prompt.

    D: ``n_background`` records scoring C/2 for every candidate, except one record that
    scores 0 for the seed prompt (so the seed trails by C/2 and never wins a tie).
    With ``trailing`` False (q < 1, where a subsampled trailing record would make the
    deficit random) every background record scores 0 for every candidate instead.
    The canary scores 3C for the seed prompt (clipped to C: a scorer that forgot to
    clip would show it) and 0 for every other candidate; ``make(position)`` puts it at
    that index (None: no canary).
    """
    from dp_textgrad.privacy.data import PrivateDataset
    from dp_textgrad.tasks.base import ClassificationTask, Example, RecordOutcomes

    @dataclasses.dataclass
    class _TableTask(ClassificationTask):
        favoured: str = seed_prompt

        def private_outcomes(self, engine: Any, prompt: str, batch: Any, verbalizers: Any = None) -> Any:
            texts = [record.unwrap().text for record in batch]  # inside the DP scorer only
            is_seed = prompt == self.favoured
            background = 0.5 * self.clip_bound if trailing else 0.0
            scores = np.array(
                [
                    (_CANARY_RAW * self.clip_bound if is_seed else 0.0)
                    if text == _CANARY_TEXT
                    else (0.0 if (is_seed and text == _TRAILING_TEXT) else background)
                    for text in texts
                ]
            )
            labels = np.zeros(len(texts), dtype=int)
            return RecordOutcomes(scores=scores, gold=labels, predicted=labels)

    records = [Example(f"audit baseline record {i}", "yes") for i in range(n_background)]

    def make(position: int | None) -> Any:
        private = list(records)
        if position is not None:
            private.insert(position, Example(_CANARY_TEXT, "yes"))
        return _TableTask(
            name="audit-table",
            description="Answer yes or no.",
            labels=["yes", "no"],
            private_train=PrivateDataset(private),
            test=[],
            clip_bound=clip_bound,
            seed_prompt=seed_prompt,
        )

    return make


def audit_controller_loop(
    *,
    epsilon: float = 2.0,
    delta: float = 1e-5,
    generations: int = 2,
    population: int = 3,
    parents: int = 1,
    selection: Literal["gaussian", "exponential"] = "gaussian",
    n_background: int = 20,
    runs: int = 300,
    alpha: float = 0.05,
    actual_noise_factor: float = 1.0,
    positive_control: bool = True,
    seed: int = 0,
    sampling_rate: float = 1.0,
    positions: int = 1,
    replay_variants: bool = True,
) -> MechanismAuditResult:
    """Audit the real DP-ES loop (``EvolutionController``) with the tests-only ScriptedEngine.

    Calibration runs once (``DPEvolutionStrategy`` builds the plan); each run then
    builds a fresh controller with the calibrated parameters, its own noise seed and a
    recording ledger, and runs every generation. Guess "member" iff the released
    prompt is the seed prompt (the candidate the canary favours). The claim is the
    library's bound on the events the runs actually charged (checked equal across runs).
    Noise off: the controller's noise source is replaced by one with zero noise;
    ``actual_noise_factor`` scales the released noise without changing what is charged.

    ``sampling_rate`` < 1 runs the real Poisson subsampling of every generation; the
    background then scores 0 for every candidate and there is no noise-off control
    (ties make it meaningless). The canary stands at each of ``positions`` indices in turn
    (one group of member runs each, Bonferroni over the groups), as in ``audit_scorer``.
    ``replay_variants``: build generation 0's public variants once and replay them in
    every run (the same runs, faster; see :class:`_ReplayedVariants`).
    """
    from dp_textgrad._textgrad import import_textgrad
    from dp_textgrad.dp_es.optimizer import DPEvolutionStrategy, EvolutionController
    from dp_textgrad.dp_es.plan import RunPlan
    from dp_textgrad.dp_es.selector import SELECTION_STRATEGIES
    from dp_textgrad.engines.scripted import ScriptedEngine

    subsampled = sampling_rate != 1.0
    if subsampled and positive_control:
        raise ValueError(
            "positive_control: the noise-off control needs sampling_rate = 1; pass "
            "positive_control=False with a subsample"
        )
    trials = Trials.checked(runs, sampling_rate, actual_noise_factor, delta, alpha, positive_control, seed)
    runs, q, factor = trials.runs, trials.sampling_rate, trials.noise_factor
    if not 1 <= positions <= n_background + 1:
        raise ValueError(f"positions: must be in [1, n_background + 1 = {n_background + 1}], got {positions}")
    strategy = SELECTION_STRATEGIES.get(selection)
    if strategy is None:
        raise ValueError(f"selection: use one of {sorted(SELECTION_STRATEGIES)}, got {selection!r}")
    started = time.perf_counter()
    tg = import_textgrad()
    seed_prompt = "Answer the question."
    make_task = _audit_task(seed_prompt, n_background, 1.0, trailing=not subsampled)
    # q = 1: the canary at the end; q < 1: at each of `positions` indices (one member group each)
    member_positions = list(range(positions)) if subsampled else [n_background]
    engine = ScriptedEngine()
    settings: dict[str, Any] = dict(
        epsilon=epsilon,
        delta=delta,
        generations=generations,
        population=population,
        parents=parents,
        selection=selection,
        sampling_rate=q,
        use_critiques=False,
        llm_operators=False,
        seed=seed,
        # DP confusion feedback rides on Gaussian scoring only.
        feedback="dp_confusion" if strategy.supports_feedback else "none",
    )
    first_task = make_task(member_positions[0])
    settings["dataset_size"] = len(first_task.private_train)  # synthetic audit data: N declared, the search audited
    planner = DPEvolutionStrategy(
        [tg.Variable(seed_prompt, role_description="system prompt", requires_grad=True)],
        task=first_task,
        engine=engine,
        **settings,
    )
    config = planner.config
    assert config.delta is not None  # the planner resolved it
    run_delta: float = config.delta
    charged_by_first_run: list[dp_accounting.DpEvent] = []
    replayed = _ReplayedVariants() if replay_variants else None

    def one_run(task: Any, noise_seed: int, noise_off: bool) -> bool:
        variable = tg.Variable(seed_prompt, role_description="system prompt", requires_grad=True)
        ledger = _RecordingLedger(config.epsilon, run_delta)
        run_config = config.model_copy(update={"insecure_noise_seed": noise_seed})
        # The calibrated plan, reused: only the (insecure, audit-only) noise seed differs per run.
        controller = EvolutionController(
            [variable],
            task=task,
            engine=engine,
            ledger=ledger,  # type: ignore[arg-type]
            plan=RunPlan.with_value(run_config, planner.plan.value),
        )
        if replayed is not None:  # the LLM operators are off (settings): no engine call to skip
            replayed.install(controller.mutation)
        if noise_off or factor != 1.0:
            replaced = NoiseOff(noise_seed) if noise_off else ScaledNoise(noise_seed, factor)
            controller.noise = controller.scorer.noise = replaced
            controller.scorer.sampling_rng = replaced.sampling_generator
        result = controller.run()
        if not charged_by_first_run:
            charged_by_first_run.extend(ledger.events)
        elif [repr(e) for e in ledger.events] != [repr(e) for e in charged_by_first_run]:
            raise RuntimeError("audit_controller_loop: runs charged different events; the claim would not apply")
        return result.prompt == seed_prompt

    def arms(noise_off: bool) -> tuple[list[np.ndarray], np.ndarray]:
        base = 1_000_000 * (seed + 1) + (500_000 if noise_off else 0)
        per_group = max(1, runs // len(member_positions))
        nonmember_task = make_task(None)
        nonmembers = np.array([one_run(nonmember_task, base + 2 * i + 1, noise_off) for i in range(runs)])
        groups = []
        for g, position in enumerate(member_positions):
            task = make_task(position)
            groups.append(
                np.array([one_run(task, base + 2 * (g * per_group + i), noise_off) for i in range(per_group)])
            )
        return groups, nonmembers

    groups, nonmembers = arms(noise_off=False)
    bound = max(
        (binary_bound(members, nonmembers, delta, alpha / len(groups)) for members in groups), key=lambda b: b.epsilon
    )
    control = None
    if positive_control:
        control_groups, control_nonmembers = arms(noise_off=True)
        control = binary_bound(control_groups[0], control_nonmembers, delta, alpha)
    # The claim: the default accountants on what every run actually charged.
    claim = float(smallest_bound(charged_by_first_run, delta))
    return trials.result(
        f"controller_loop_{selection}",
        claim,
        bound,
        control,
        started=started,
        delta=run_delta,
        parameters={
            "budget_epsilon": float(config.epsilon),
            "generations": generations,
            "population": population,
            "parents": parents,
            "selection": selection,
            "n_background": n_background,
            "noise_multiplier": planner.noise_multiplier,
            "selection_epsilon": planner.selection_epsilon,
            "feedback": config.feedback,
            "use_critiques": False,
            "actual_noise_factor": factor,
            "positions": len(member_positions),
            "seed": seed,
        },
        note="statistic: the released prompt is the one the canary favours; real EvolutionController, "
        "ScriptedEngine, calibration once, recording ledger",
    )
