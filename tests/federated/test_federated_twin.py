"""The twin-run test for a federated run: D versus D plus one long record at one silo.

Three silo files; in the second run silo 1 also holds record ``x`` (ten times the median
length, rare tokens, a label no candidate predicts: its clipped score is 0). Neither N nor
the silos' sizes are declared: each silo releases a DP count of its records (discrete
Laplace, charged in its own account), and the coordinator derives N, q and every displayed
size from their sum. The count noise is coupled as the DP proof couples it: the D+x silo's
count noise is one smaller (:func:`couple_silo_count`), so both runs release the same counts.
The noise is seeded. A silo's sampler draws one uniform per record, so x shifts the later
generations' subsamples at its silo and DP estimates may differ there; those DP-output
fields (and the decimals of the console) are masked, and everything else the coordinator
shows or writes must agree, for the strictest placement (``local``) and for ``central``.
Generation 0 is drawn identically, so its values must agree exactly. The operator-only
area must differ (the test can see a leak).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dp_textgrad import cli
from dp_textgrad.settings import EngineSection
from tests.twin import LengthTimedEngine, base_rows, collect, long_record, masked_differences, write_rows


def couple_silo_count(monkeypatch, silo_records: int) -> None:
    """The coupling of the count's DP proof, made explicit (tests only): in the D+x run the silo that
    holds x (the only one with ``silo_records`` records) draws count noise one smaller, so it releases
    the count of D. Each noise value e at D pairs with e - 1 at D+x, their probabilities within a
    factor exp(eps_c); the count draws as much randomness either way, so later draws are unchanged."""
    from dp_textgrad.privacy import mechanisms

    release = mechanisms.LaplaceCountMechanism.release
    monkeypatch.setattr(mechanisms.LaplaceCountMechanism, "release",
                        lambda self, count, noise: release(self, count - 1 if count == silo_records else count,
                                                           noise))


def federated_twin(root, rows_per_silo, monkeypatch, placement: str):
    (root / "silos").mkdir(parents=True)
    silo_lines = []
    for i, rows in enumerate(rows_per_silo):
        write_rows(root / "silos" / f"s{i}.csv", rows)
        silo_lines.append(f"    - {{name: s{i}, train: s{i}.csv}}")  # sizes not declared: counted
    write_rows(root / "silos" / "test.csv", base_rows(9))
    settings = root / "silos" / "silos.yaml"
    settings.write_text(
        "task:\n  train: s0.csv\n  test: test.csv\n  description: Customer messages about a bill, a technical "
        "problem or fraud.\n  seed_prompt: Label the message.\n"
        "dp: {epsilon: 4, generations: 3, population: 3, parents: 2, sampling_rate: 0.5, "
        "feedback: none, insecure_noise_seed: 11}\n"
        f"output: {{runs_root: {(root / 'runs').as_posix()}}}\n"
        f"federation:\n  placement: {placement}\n  transport: in_process\n  silos:\n" + "\n".join(silo_lines) + "\n",
        encoding="utf-8")
    monkeypatch.setattr(EngineSection, "build", lambda section: LengthTimedEngine())
    result = CliRunner().invoke(cli.app, ["federated", "--silos", str(settings)])
    run_dirs = [p for p in (root / "runs").glob("federated-*") if p.is_dir()]
    assert len(run_dirs) == 1, result.output
    return collect(root, run_dirs[0], result)


# distributed with secure aggregation: the in-process secure sum (the same clipped sum as SecAgg+).
@pytest.mark.parametrize("placement", ["local", "central", "distributed\n  secure_aggregation: true"],
                         ids=["local", "central", "distributed-secure"])
def test_a_long_record_at_one_silo_changes_nothing_released(tmp_path, monkeypatch, placement) -> None:
    rows = base_rows(60)
    silos = [rows[0:20], rows[20:40], rows[40:60]]
    d = federated_twin(tmp_path / "d", silos, monkeypatch, placement)
    with pytest.MonkeyPatch.context() as coupling:  # the D+x run only
        couple_silo_count(coupling, len(silos[1]) + 1)
        dx = federated_twin(tmp_path / "dx", [silos[0], silos[1] + [long_record(rows)], silos[2]], monkeypatch,
                            placement)
    for capture in (d, dx):
        assert capture.exit_code == 0, capture.stdout + capture.stderr
        assert "federation.json" in capture.released
    diff = masked_differences(d, dx)
    assert not diff, f"released channels differ between D and D+x beyond DP outputs: {diff}"
    first = [json.loads(c.released["metrics.jsonl"].decode().splitlines()[0]) for c in (d, dx)]
    assert first[0] == first[1]  # generation 0: the same subsample (x drew after D) and the same noise
    assert d.operator and any(d.operator.get(n) != dx.operator.get(n) for n in set(d.operator) | set(dx.operator))
