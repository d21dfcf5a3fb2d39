"""A silo's ``max_epsilon`` is a privacy filter over its whole account (issue 47, item 8).

A silo's account spans runs, and the coordinator that sends the requests may choose their
parameters after seeing earlier releases: a cap on that account is valid only as a privacy
filter, fixed before the first request. The silo therefore checks the Renyi filter bound
(``filter_epsilon``), as a dataset's lifetime store does, not the smallest of PLD and RDP, which
holds only for a sequence fixed in advance. Two runs, each a count at eps_c 0.2 and six
Poisson-sampled Gaussians (q 0.1, z 1.3): min(PLD, RDP) with the counts added is 2.1997, the
filter bound 3.0394, so a cap of 2.5 refuses the last of them.
"""

from __future__ import annotations

import json

import dp_accounting.dp_event as dpe
import pytest

from dp_textgrad.federated import SiloRefused, SiloState
from dp_textgrad.federated.placement import staged_bound
from dp_textgrad.privacy.accounting.bounds import smallest_bound
from dp_textgrad.privacy.accounting.events import PureDpEvent
from dp_textgrad.privacy.accounting.filter import filter_epsilon
from dp_textgrad.privacy.accounting.serialize import event_to_dict
from dp_textgrad.tasks.synthetic import make_support_task
from tests import helpers

SEARCH = dpe.PoissonSampledDpEvent(0.1, dpe.GaussianDpEvent(1.3))
COUNTS = {"pure": PureDpEvent(0.2), "legacy": dpe.LaplaceDpEvent(5.0)}  # legacy: what accounts held before
CAP = 2.5


@pytest.fixture(scope="module")
def task():
    return make_support_task(seed=3, n_private=120, n_test=20)


def two_runs(count: dpe.DpEvent) -> list[dpe.DpEvent]:
    return [count] + [SEARCH] * 6 + [count] + [SEARCH] * 6


def silo_with_account(task, tmp_path, events: list[dpe.DpEvent], cap: float):
    path = tmp_path / "silo.json"
    path.write_text(json.dumps({"silo": "s0", "events": [event_to_dict(e) for e in events], "releases": []}))
    return helpers.federated_silos(task, "local", count=1, max_epsilon=cap, delta=1e-5, account_path=path,
                                   size_epsilon=0.2)[0]


def sums_request() -> dict:
    # Under 'local' the silo adds the whole noise: its event is PoissonSampled(0.1, Gaussian(1.3)).
    return {"kind": "noised_sums", "prompts": ["Label the message.", "Name the request."], "sampling_rate": 0.1,
            "clip_bound": 1.0, "noise_multiplier": 1.3, "feedback_noise_multiplier": None, "keep_confusion": False}


def test_the_two_runs_fit_the_tightest_bound_but_not_the_filter() -> None:
    # What the silo checked before: the counts' pure epsilons plus the smallest bound of the rest.
    assert staged_bound(two_runs(COUNTS["legacy"]), 1e-5) == pytest.approx(2.1997, abs=1e-4)
    assert 0.4 + smallest_bound([SEARCH] * 12, 1e-5) == pytest.approx(2.1997, abs=1e-4)
    assert filter_epsilon(two_runs(COUNTS["pure"]), 1e-5) == pytest.approx(3.0394, abs=1e-4)
    assert filter_epsilon(two_runs(COUNTS["legacy"]), 1e-5) == filter_epsilon(two_runs(COUNTS["pure"]), 1e-5)


@pytest.mark.parametrize("kind", sorted(COUNTS))
def test_a_silo_refuses_the_step_that_takes_its_filter_bound_past_its_cap(task, tmp_path, kind) -> None:
    before = two_runs(COUNTS[kind])[:-1]  # everything but the second run's last step
    silo = silo_with_account(task, tmp_path, before, CAP)
    with pytest.raises(SiloRefused, match="max_epsilon"):
        silo.handle(sums_request(), SiloState())
    assert len(json.loads((tmp_path / "silo.json").read_text())["events"]) == len(before)  # nothing recorded
    # Under a cap above the filter bound the same step is answered and recorded.
    roomy = silo_with_account(task, tmp_path, before, 3.1)
    roomy.handle(sums_request(), SiloState())
    assert len(json.loads((tmp_path / "silo.json").read_text())["events"]) == len(before) + 1


@pytest.mark.parametrize("kind", sorted(COUNTS))
def test_a_silo_refuses_a_count_past_its_filter_cap(task, tmp_path, kind) -> None:
    count = COUNTS[kind]
    before = [count] + [SEARCH] * 12  # the second run's count is asked last
    silo = silo_with_account(task, tmp_path, before, CAP)
    with pytest.raises(SiloRefused, match="max_epsilon"):
        silo.handle({"kind": "size_count"}, SiloState())
    assert len(json.loads((tmp_path / "silo.json").read_text())["events"]) == len(before)
