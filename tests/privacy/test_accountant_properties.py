"""Property tests for the accountants, the ledger and calibration (hypothesis)."""

from __future__ import annotations

import math

import dp_accounting as dpa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dp_textgrad.privacy.accounting import (
    AdvancedCompositionAccountant,
    BasicCompositionAccountant,
    BudgetExceeded,
    PldAccountant,
    PrivacyLedger,
    RdpAccountant,
    calibrate_noise_multiplier,
    calibrate_pure_epsilon,
    default_accountants,
    event_from_dict,
    event_to_dict,
    smallest_bound,
)
from dp_textgrad.privacy.accounting.events import GumbelTopKDpEvent, PureDpEvent

G = dpa.GaussianDpEvent
Poisson = dpa.PoissonSampledDpEvent
Self = dpa.SelfComposedDpEvent

# PLD builds of subsampled Gaussians take ~0.2 s each: keep example counts modest.
FAST = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])

rates = st.sampled_from([0.01, 0.05, 0.2, 1.0])
noise = st.floats(0.6, 6.0)
eps0s = st.floats(0.005, 0.5)
deltas = st.sampled_from([1e-8, 1e-6, 1e-5, 1e-3])
TOL = 1e-9  # floating slack for "<=" between two computed bounds


def _every_accountant():
    return default_accountants()


@SLOW
@given(q=rates, z=noise, t1=st.integers(1, 200), extra=st.integers(1, 200), delta=deltas)
def test_gaussian_epsilon_grows_with_steps(q, z, t1, extra, delta):
    for a in _every_accountant():
        short = a.epsilon([Self(Poisson(q, G(z)), t1)], delta)
        long = a.epsilon([Self(Poisson(q, G(z)), t1 + extra)], delta)
        assert short <= long + TOL, a.name


@SLOW
@given(q=rates, z=noise, factor=st.floats(1.05, 3.0), steps=st.integers(1, 200), delta=deltas)
def test_gaussian_epsilon_shrinks_with_noise(q, z, factor, steps, delta):
    for a in _every_accountant():
        less_noise = a.epsilon([Self(Poisson(q, G(z)), steps)], delta)
        more_noise = a.epsilon([Self(Poisson(q, G(z * factor)), steps)], delta)
        assert more_noise <= less_noise + TOL, a.name


@FAST
@given(
    q=rates,
    eps0=eps0s,
    k=st.integers(1, 5),
    t1=st.integers(1, 100),
    extra=st.integers(1, 100),
    shrink=st.floats(0.1, 0.95),
    delta=deltas,
)
def test_pure_epsilon_grows_with_steps_and_shrinks_with_noise(q, eps0, k, t1, extra, shrink, delta):
    for a in _every_accountant():
        base = a.epsilon([Self(Poisson(q, GumbelTopKDpEvent(eps0, k)), t1)], delta)
        longer = a.epsilon([Self(Poisson(q, GumbelTopKDpEvent(eps0, k)), t1 + extra)], delta)
        quieter = a.epsilon([Self(Poisson(q, GumbelTopKDpEvent(eps0 * shrink, k)), t1)], delta)
        assert base <= longer + TOL, a.name
        assert quieter <= base + TOL, a.name
        pure_base = a.epsilon([Self(PureDpEvent(eps0), t1)], delta)
        pure_longer = a.epsilon([Self(PureDpEvent(eps0), t1 + extra)], delta)
        assert pure_base <= pure_longer + TOL, a.name


@SLOW
@given(q=st.sampled_from([0.01, 0.1, 1.0]), steps=st.integers(1, 2000), target=st.floats(0.2, 8.0), delta=deltas)
def test_calibrated_noise_multiplier_never_exceeds_target(q, steps, target, delta):
    rdp = RdpAccountant()
    plan = lambda z: Self(Poisson(q, G(z)), steps)  # noqa: E731
    z = calibrate_noise_multiplier(plan, target, delta, rdp)
    assert rdp.epsilon([plan(z)], delta) <= target
    assert rdp.epsilon([plan(z * 0.999)], delta) > target * 0.999  # close to the smallest z


@SLOW
@given(steps=st.integers(1, 50), target=st.floats(0.5, 4.0))
def test_calibrated_noise_never_exceeds_target_with_coarse_pld(steps, target):
    # coarse PLD keeps each evaluation cheap; the guarantee does not depend on the interval
    accountants = [PldAccountant(1e-2)]
    plan = lambda z: Self(Poisson(0.1, G(z)), steps)  # noqa: E731
    z = calibrate_noise_multiplier(plan, target, 1e-5, accountants)
    assert smallest_bound([plan(z)], 1e-5, accountants) <= target


@SLOW
@given(
    q=st.sampled_from([0.05, 0.2, 1.0]),
    k=st.integers(1, 4),
    steps=st.integers(1, 100),
    target=st.floats(0.2, 8.0),
    delta=deltas,
)
def test_calibrated_pure_epsilon_never_exceeds_target(q, k, steps, target, delta):
    accountants = default_accountants()
    plan = lambda e: Self(Poisson(q, GumbelTopKDpEvent(e, k)), steps)  # noqa: E731
    eps0 = calibrate_pure_epsilon(plan, target, delta, accountants)
    assert eps0 > 0
    assert smallest_bound([plan(eps0)], delta, accountants) <= target


# a small pool of events a run produces (cheap to account for)
pool = st.sampled_from(
    [
        PureDpEvent(0.05),
        PureDpEvent(0.3),
        GumbelTopKDpEvent(0.02, 3),
        Poisson(0.1, GumbelTopKDpEvent(0.05, 2)),
        Poisson(0.2, PureDpEvent(0.5)),
        G(20.0),  # plain Gaussians merge into z / sqrt(count): keep z large so PLD builds stay cheap
        Poisson(0.05, G(2.0)),
        Self(PureDpEvent(0.01), 4),
        dpa.ComposedDpEvent([PureDpEvent(0.02), G(30.0)]),
    ]
)


@FAST
@given(events=st.lists(pool, min_size=1, max_size=25), delta=st.sampled_from([1e-6, 1e-5]))
def test_ledger_total_equals_fresh_accountants(events, delta):
    ledger = PrivacyLedger(1e6, delta)
    for i, event in enumerate(events):
        ledger.spend(event, f"step {i}")
    fresh = {a.name: a.epsilon(events, delta) for a in default_accountants()}
    assert ledger.epsilons() == fresh
    assert ledger.epsilon() == min(fresh.values())
    assert ledger.entries[-1].epsilon == ledger.epsilon()


@FAST
@given(events=st.lists(pool, min_size=1, max_size=12))
def test_ledger_epsilon_never_decreases(events):
    ledger = PrivacyLedger(1e6, 1e-5)
    previous = 0.0
    for i, event in enumerate(events):
        entry = ledger.spend(event, f"step {i}")
        assert entry.epsilon >= previous - TOL
        previous = entry.epsilon


json_scalars = st.one_of(st.integers(-1000, 1000), st.floats(-1e6, 1e6), st.text(max_size=10), st.booleans())


@FAST
@given(
    events=st.lists(pool, min_size=0, max_size=10),
    labels=st.lists(st.text(min_size=1, max_size=20), min_size=10, max_size=10),
    metadata=st.dictionaries(st.text(max_size=8), json_scalars, max_size=4),
    budget=st.floats(1.0, 1e4),
    delta=st.floats(1e-12, 0.5),
    unsafe=st.booleans(),
)
def test_jsonl_round_trip(tmp_path_factory, events, labels, metadata, budget, delta, unsafe):
    ledger = PrivacyLedger(budget, delta, [RdpAccountant(), AdvancedCompositionAccountant("kov")])
    for event, label in zip(events, labels):
        try:
            ledger.spend(event, label, metadata)
        except BudgetExceeded:
            break
    if unsafe:
        ledger.mark_unsafe("unsafe mode")
    path = tmp_path_factory.mktemp("ledger") / "run.jsonl"
    ledger.to_jsonl(path)
    loaded = PrivacyLedger.from_jsonl(path)
    assert loaded.events == ledger.events
    assert loaded.entries == ledger.entries
    assert loaded.epsilon_budget == ledger.epsilon_budget and loaded.delta == ledger.delta
    assert loaded.unsafe == ledger.unsafe
    assert [a.config() for a in loaded.accountants] == [a.config() for a in ledger.accountants]


def _events(depth: int = 2):
    leaves = st.one_of(
        st.builds(PureDpEvent, st.floats(0, 10)),
        st.builds(GumbelTopKDpEvent, st.floats(0, 10), st.integers(1, 10)),
        st.builds(G, st.floats(0.1, 100)),
        st.builds(dpa.ZCDpEvent, st.floats(0, 5)),
        st.just(dpa.NoOpDpEvent()),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.builds(Poisson, st.floats(0, 1), inner),
            st.builds(Self, inner, st.integers(0, 1000)),
            st.builds(dpa.ComposedDpEvent, st.lists(inner, max_size=3)),
        ),
        max_leaves=6,
    )


@settings(max_examples=60, deadline=None)
@given(event=_events())
def test_event_dict_round_trip(event):
    assert event_from_dict(event_to_dict(event)) == event


@FAST
@given(first=st.floats(0.1, 0.9), second=st.floats(0.2, 3.0), delta=st.sampled_from([1e-6, 1e-5]))
def test_budget_refusal_leaves_ledger_unchanged(tmp_path_factory, first, second, delta):
    ledger = PrivacyLedger(1.0, delta, [BasicCompositionAccountant(), RdpAccountant()])
    ledger.spend(PureDpEvent(first), "first")
    before_entries, before_bounds = ledger.entries, ledger.epsilons()
    directory = tmp_path_factory.mktemp("refusal")
    ledger.to_jsonl(directory / "before.jsonl")
    affordable = ledger.can_afford(PureDpEvent(second))
    if affordable:
        ledger.spend(PureDpEvent(second), "second")
        assert ledger.epsilon() <= 1.0
        return
    with pytest.raises(BudgetExceeded, match="second"):
        ledger.spend(PureDpEvent(second), "second")
    assert ledger.entries == before_entries
    assert ledger.epsilons() == before_bounds
    ledger.to_jsonl(directory / "after.jsonl")
    assert (directory / "after.jsonl").read_text() == (directory / "before.jsonl").read_text()


@settings(max_examples=40, deadline=None)
@given(
    budget=st.one_of(
        st.floats(max_value=0.0),
        st.just(math.inf),
        st.just(-math.inf),
        st.just(math.nan),
        st.text(max_size=3),
        st.none(),
    )
)
def test_bad_budget_raises_naming_the_field(budget):
    with pytest.raises(ValueError, match="epsilon_budget"):
        PrivacyLedger(budget, 1e-5)


@settings(max_examples=40, deadline=None)
@given(delta=st.one_of(st.floats(max_value=0.0), st.floats(min_value=1.0), st.just(math.nan)))
def test_bad_delta_raises_naming_the_field(delta):
    with pytest.raises(ValueError, match="delta"):
        PrivacyLedger(1.0, delta)


@FAST
@given(events=st.lists(pool, min_size=1, max_size=15), delta=st.sampled_from([1e-6, 1e-5]))
def test_smallest_bound_is_the_minimum_of_all_bounds(events, delta):
    accountants = default_accountants()
    bounds = {a.name: a.epsilon(events, delta) for a in accountants}
    assert smallest_bound(events, delta, accountants) == min(bounds.values())
    # subsets of accountants can only give larger (or equal) smallest bounds
    assert smallest_bound(events, delta, [RdpAccountant()]) >= min(bounds.values())
