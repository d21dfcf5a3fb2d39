"""L2 end-to-end canary audits (dp_textgrad.audit.end_to_end), the report's audit section and
``dp-textgrad audit canaries``.

Most tests use the tests-only ScriptedEngine (no model): whole audits run in a few
seconds. Its generator can "memorise": given a context that already holds a canary's
full text, it continues the canary's prefix with the secret, so a prompt that copies
member canaries is a positive control at the attack level. One slow test runs a tiny
audit with the local model.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import dp_textgrad.audit as audit_package
from dp_textgrad import cli as main_cli
from dp_textgrad.audit import (
    CanaryAuditOptions,
    attack_release,
    bootstrap_ci,
    canaries_for_task,
    gaussian_dp_estimate,
    insert_canaries,
    pr_auc,
    read_audit,
    run_canary_audit,
)
from dp_textgrad.audit.end_to_end.audit_file import canary_fingerprint
from dp_textgrad.audit.end_to_end.canary_audit import judge
from dp_textgrad.audit.statistics.metrics import pr_auc_rows
from dp_textgrad.dp_es.config import DPESConfig
from dp_textgrad.engines.scripted import ScriptedEngine
from dp_textgrad.report import AUDIT_FILE_NAME, FEWSHOT_BANNER, UNSAFE_BANNER, write_report
from dp_textgrad.settings import EngineSection
from dp_textgrad.tasks.synthetic import generate_support_examples, make_support_task

runner = CliRunner()
FAST = settings(max_examples=40, deadline=None)
# Audit settings for a small private set: the canary share is far above the library's 1%.
SMALL_SET = CanaryAuditOptions(warn_share=0.5, max_share=0.5, n_exposure_references=5)
SCHEDULE = dict(epsilon=2.0, generations=2, population=3, parents=1, sampling_rate=0.5, use_critiques=False)


def memorising_answer(prompt: str, system_prompt: str | None) -> str:
    """Continue ``... <prefix>`` with `` <secret>.`` when the context already holds ``<prefix> <secret>.``."""
    last = prompt.rstrip().rsplit("Message: ", 1)[-1]
    match = re.search(re.escape(last) + r" (\d{6} [a-z]+ [a-z]+)\.", prompt[: -len(last) - 1])
    return f" {match.group(1)}." if match else " Thank you for your message."


def engine() -> ScriptedEngine:
    return ScriptedEngine(memorising_answer, max_context_tokens=4096)


@pytest.fixture(scope="module")
def task():
    return make_support_task(seed=0, n_private=1, n_public=6, n_test=5)


@pytest.fixture(scope="module")
def records():
    return generate_support_examples(16, seed=1)


@pytest.fixture(scope="module")
def dp_audit(task, records, tmp_path_factory):
    config = DPESConfig(**SCHEDULE, insecure_noise_seed=3)
    return run_canary_audit(task, engine(), config, records=records, n_canaries=12, seed=0, mode="dp",
                            options=SMALL_SET, runs_root=tmp_path_factory.mktemp("runs"))


# -- options and small pieces ---------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    (dict(warn_share=0.6, max_share=0.5), "warn_share"),
    (dict(n_resamples=999), "n_resamples"),
    (dict(attacks=("loss", "nope")), "unknown"),
    (dict(k_pos=-1), "k_pos"),
    (dict(n_exposure_references=0), "n_exposure_references"),
    (dict(primary_attack="grad_norm", attacks=("loss",)), "primary_attack"),
    (dict(fprs=(0.0,)), "fprs"),
])
def test_options_reject_bad_settings(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        CanaryAuditOptions(**kwargs)


@FAST
@given(m=st.integers(1, 300))
def test_default_guesses_are_fixed_by_m_and_fit(m) -> None:
    k_pos, k_neg = CanaryAuditOptions().guesses(m)
    assert k_pos >= 1 and k_neg >= 0 and k_pos + k_neg <= m
    assert (k_pos, k_neg) == CanaryAuditOptions().guesses(m)


def test_explicit_guesses_that_do_not_fit_are_refused() -> None:
    with pytest.raises(ValueError, match="exceed"):
        CanaryAuditOptions(k_pos=5, k_neg=5).guesses(8)


@FAST
@given(members=st.lists(st.integers(-3, 3), min_size=1, max_size=15),
       nonmembers=st.lists(st.integers(-3, 3), min_size=1, max_size=15))
def test_vectorised_pr_auc_equals_scikit_learn(members, nonmembers) -> None:
    m, n = np.array(members, dtype=float), np.array(nonmembers, dtype=float)
    assert pr_auc_rows(m[None, :], n[None, :])[0] == pytest.approx(pr_auc(m, n), abs=1e-12)


def test_pr_auc_bootstrap_is_fast_and_brackets_the_estimate() -> None:
    rng = np.random.default_rng(0)
    interval = bootstrap_ci(rng.normal(1, 1, 30), rng.normal(0, 1, 30), "pr_auc", n_resamples=2000)
    assert interval.low <= interval.estimate <= interval.high


def test_gaussian_dp_estimate_of_identical_scores_is_zero() -> None:
    # Unequal group sizes used to give mu > 0 through smoothing at the trivial threshold.
    estimate = gaussian_dp_estimate(np.zeros(10), np.zeros(3), 1e-5)
    assert estimate.mu == 0 and estimate.epsilon == 0


def test_fingerprint_identifies_canaries_without_holding_secrets(task) -> None:
    a, b = canaries_for_task(task, 6, seed=0), canaries_for_task(task, 6, seed=1)
    assert canary_fingerprint(a) == canary_fingerprint(canaries_for_task(task, 6, seed=0))
    assert canary_fingerprint(a) != canary_fingerprint(b)
    assert all(c.secret not in canary_fingerprint(a) for c in a)


# -- attacks on a release (positive and negative control, no optimiser) ---------------------------
def test_a_prompt_copying_the_members_is_caught_by_every_leakage_measure(task) -> None:
    canary_set = canaries_for_task(task, 40, seed=2)
    members = canary_set.members()
    leaky = task.seed_prompt + "\n\n" + "\n\n".join(task.render_demo(c.example) for c in members)
    part = attack_release(engine(), task, leaky, canary_set, delta=1e-5,
                          options=CanaryAuditOptions(n_exposure_references=3))
    assert part["leakage"]["prompt_text"]["verbatim_members"] == len(members)
    assert part["leakage"]["prompt_text"]["verbatim_nonmembers"] == 0
    assert part["leakage"]["extraction"]["extracted_members"] == len(members)
    assert part["leakage"]["extraction"]["extracted_nonmembers"] == 0
    assert part["attacks"]["prompt_text"]["auc"]["estimate"] == 1.0
    assert part["attacks"]["extraction"]["auc"]["estimate"] == 1.0
    # 10 "in" + 10 "out" guesses, all right: the one-run bound is positive even at alpha / n_attacks.
    assert part["eps_lb"]["epsilon"] > 0.5
    assert part["eps_lb"]["attack"] in ("prompt_text", "extraction")
    judged_dp = judge("dp", 2.0, part)
    assert judged_dp["violation"] and "verbatim" in judged_dp["verdict"]
    judged_unsafe = judge("unsafe", None, part)
    assert judged_unsafe["leak_detected"] and judged_unsafe["verdict"].startswith("LEAK DETECTED")


def test_the_seed_prompt_leaks_nothing(task) -> None:
    canary_set = canaries_for_task(task, 16, seed=3)
    part = attack_release(engine(), task, task.seed_prompt, canary_set, delta=1e-5,
                          options=CanaryAuditOptions(n_exposure_references=3))
    assert part["leakage"]["prompt_text"]["verbatim_members"] == 0
    assert part["leakage"]["extraction"]["extracted_members"] == 0
    assert part["attacks"]["grad_norm"] == {"available": False, "note": part["attacks"]["grad_norm"]["note"]}
    assert part["eps_lb"]["n_attacks"] == 9  # 3 leakage measures + 6 membership attacks (no grad_norm)
    judged = judge("dp", 2.0, part)
    assert not judged["violation"] and judged["verdict"].startswith("no violation shown")
    assert "proves nothing" in judged["verdict"]
    assert judge("unsafe", None, part)["leak_detected"] == (part["eps_lb"]["epsilon"] > 0)


def test_a_lower_bound_above_the_claim_is_a_violation(task) -> None:
    canary_set = canaries_for_task(task, 40, seed=2)
    leaky = "\n\n".join(task.render_demo(c.example) for c in canary_set.members())
    part = attack_release(engine(), task, leaky, canary_set, delta=1e-5,
                          options=CanaryAuditOptions(n_exposure_references=3))
    part["leakage"]["prompt_text"]["verbatim_members"] = 0  # only the bound speaks
    judged = judge("dp", 0.1, part)
    assert judged["violation"] and "exceeds the claimed epsilon" in judged["verdict"]


# -- whole audits with the scripted engine ---------------------------------------------------------
def test_dp_audit_writes_audit_json_report_section_and_run_log(dp_audit, task, records) -> None:
    run_dir = dp_audit.run_dir
    audit = read_audit(run_dir)
    assert audit == json.loads((run_dir / AUDIT_FILE_NAME).read_text(encoding="utf-8"))
    for key in ("format", "version", "kind", "mode", "settings", "canaries", "claim", "leakage", "attacks",
                "per_canary", "eps_lb", "gdp_estimate", "verdict", "violation", "leak_detected", "statement",
                "code_version"):
        assert key in audit, key
    # Wall times time the private phase: operator-only, never in audit.json.
    assert "seconds" not in audit
    assert json.loads((run_dir / "operator" / "audit_seconds.json").read_text())["total"] > 0
    assert audit["mode"] == "dp" and audit["kind"] == "audit_l2"
    assert audit["claim"]["epsilon"] == pytest.approx(2.0, rel=1e-3) and not audit["claim"]["unsafe"]
    assert dp_audit.claimed_epsilon == audit["claim"]["epsilon"]
    assert dp_audit.eps_lb <= audit["claim"]["epsilon"] and not dp_audit.violation
    # 12 canaries, 3 + 3 guesses, alpha / 9: even a perfect attack stays below the claim of 2, and says so.
    assert dp_audit.eps_lb <= audit["eps_lb"]["ceiling"] < 2.0
    assert any("perfect attack" in note for note in audit["notes"])
    assert audit["canaries"]["n"] == 12 == len(audit["per_canary"])
    assert audit["canaries"]["n_members"] == sum(c["included"] for c in audit["per_canary"])
    members = audit["canaries"]["n_members"]
    assert audit["canaries"]["share"] == pytest.approx(members / (len(records) + members))
    for attack in audit["attacks"].values():
        if attack["available"] and "auc" in attack:
            assert attack["auc"]["n_resamples"] >= 1000 and attack["pr_auc"]["n_resamples"] >= 1000
            assert attack["auc"]["low"] <= attack["auc"]["estimate"] <= attack["auc"]["high"]
            assert attack["magnitude"] in ("negligible", "small", "medium", "large")
            assert attack["gdp_estimate"]["kind"].startswith("estimate")
    assert audit["gdp_estimate"]["attack"] == "reference"
    report = (run_dir / "report.md").read_text(encoding="utf-8")
    assert "## Privacy audit (L2" in report and "eps_lb" in report and "never privacy" in report
    assert (run_dir / "plots" / "audit_roc.png").stat().st_size > 1000
    assert "audit_roc.png" in (run_dir / "report.html").read_text(encoding="utf-8")
    log = [json.loads(line) for line in (run_dir.parent / "run_metadata.jsonl").read_text().splitlines()]
    audit_lines = [line for line in log if line.get("kind") == "audit_l2"]
    assert len(audit_lines) == 1 and audit_lines[0]["run_dir"] == run_dir.name
    assert audit_lines[0]["eps_lb"]["epsilon"] == dp_audit.eps_lb


def test_no_secret_or_record_text_in_audit_files(dp_audit, task, records) -> None:
    canary_set = canaries_for_task(task, 12, seed=0)
    run_dir = dp_audit.run_dir
    texts = {"audit.json": (run_dir / AUDIT_FILE_NAME).read_text(encoding="utf-8"),
             "run log": (run_dir.parent / "run_metadata.jsonl").read_text(encoding="utf-8"),
             "report": (run_dir / "report.md").read_text(encoding="utf-8")}
    for name, text in texts.items():
        for canary in canary_set:
            assert canary.secret not in text, name
            assert canary.prefix not in text, name
        for record in records:
            assert record.text not in text, name
    assert json.loads(texts["audit.json"])["canaries"]["fingerprint_sha256"] == canary_fingerprint(canary_set)


def test_report_command_rebuilds_the_audit_section(dp_audit) -> None:
    run_dir = dp_audit.run_dir
    (run_dir / "report.md").unlink()
    (run_dir / "plots" / "audit_roc.png").unlink()
    result = runner.invoke(main_cli.app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert "## Privacy audit (L2" in (run_dir / "report.md").read_text(encoding="utf-8")
    assert (run_dir / "plots" / "audit_roc.png").exists()


def test_a_foreign_audit_json_is_refused_by_the_report(dp_audit, tmp_path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(dp_audit.run_dir, copy)
    (copy / AUDIT_FILE_NAME).write_text(json.dumps({"format": "something else"}), encoding="utf-8")
    with pytest.raises(ValueError, match="audit.json"):
        write_report(copy)
    result = runner.invoke(main_cli.app, ["report", str(copy)])
    assert result.exit_code == 2


def test_unsafe_audit_is_labelled_and_claims_nothing(task, records, tmp_path) -> None:
    config = DPESConfig(**SCHEDULE, insecure_noise_seed=4)
    result = run_canary_audit(task, engine(), config, records=records, n_canaries=12, seed=1, mode="unsafe",
                              options=SMALL_SET, runs_root=tmp_path, log=False)
    audit = result.audit
    assert audit["mode"] == "unsafe" and audit["claim"]["unsafe"] and audit["claim"]["epsilon"] is None
    assert audit["settings"]["config"]["mode"] == "unsafe"
    assert result.verdict.startswith(("LEAK DETECTED", "NO LEAK DETECTED"))
    assert not result.violation  # no claim, so no violation; the verdict is about the control
    report = (result.run_dir / "report.md").read_text(encoding="utf-8")
    assert report.startswith("# dp-textgrad report") and UNSAFE_BANNER in report
    assert "none (unsafe mode)" in report
    assert not (tmp_path / "run_metadata.jsonl").read_text().count('"audit_l2"')  # log=False


def test_fewshot_audit_releases_raw_demos_and_detects_the_member_leak(task, records, tmp_path) -> None:
    result = run_canary_audit(task, engine(), DPESConfig(**SCHEDULE), records=records, n_canaries=12, seed=0,
                              mode="fewshot", n_demos=8, options=SMALL_SET, runs_root=tmp_path)
    audit, fewshot = result.audit, result.audit["settings"]["fewshot"]
    released = (result.run_dir / "released_prompt.txt").read_text(encoding="utf-8")
    assert released.startswith(task.seed_prompt)
    assert released.count("Message: ") == 8 and len(fewshot["demo_positions"]) == 8
    private = insert_canaries(records, canaries_for_task(task, 12, seed=0), include="mask",
                              warn_share=0.5, max_share=0.5).records
    for position in fewshot["demo_positions"]:
        assert task.render_demo(private[position]) in released  # raw private records, verbatim
    shown = fewshot["member_canaries_shown"]
    assert shown  # seed 0 draws member canaries: the control is meaningful
    assert audit["mode"] == "fewshot" and audit["claim"]["epsilon"] is None and audit["claim"]["unsafe"]
    assert "NOT differentially private" in audit["claim"]["note"]
    assert audit["leakage"]["prompt_text"]["verbatim_members"] == len(shown)
    assert audit["leakage"]["prompt_text"]["verbatim_nonmembers"] == 0
    assert result.leak_detected and not result.violation
    assert result.verdict.startswith("LEAK DETECTED (the few-shot positive control, NOT private, works)")
    report = (result.run_dir / "report.md").read_text(encoding="utf-8")
    assert report.startswith("# dp-textgrad report") and FEWSHOT_BANNER in report
    assert "none (fewshot: NOT private)" in report
    log = [json.loads(line) for line in (tmp_path / "run_metadata.jsonl").read_text().splitlines()]
    assert log[-1]["kind"] == "audit_l2" and log[-1]["mode"] == "fewshot" and log[-1]["private"] is False
    assert log[0]["fewshot"]["n_demos"] == 8 and log[0]["unsafe"]


@pytest.mark.parametrize("kwargs, message", [
    (dict(n_canaries=0), "n_canaries"),
    (dict(n_canaries=20), "records"),
    (dict(mode="both"), "mode"),
    (dict(mode="fewshot", n_demos=0), "n_demos"),
    (dict(mode="fewshot", n_demos=17), "n_demos"),
    (dict(options=CanaryAuditOptions()), "max_share"),  # library defaults: at most 1% canaries
])
def test_bad_audits_are_refused_before_any_run(task, records, tmp_path, kwargs, message) -> None:
    arguments = dict(records=records, n_canaries=12, options=SMALL_SET, runs_root=tmp_path)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        run_canary_audit(task, engine(), DPESConfig(**SCHEDULE), **arguments)
    assert not list(tmp_path.glob("run-*"))


def test_a_dp_audit_refuses_an_unsafe_config(task, records, tmp_path) -> None:
    with pytest.raises(ValueError, match="mode"):
        run_canary_audit(task, engine(), DPESConfig(**SCHEDULE, mode="unsafe"), records=records, n_canaries=12,
                         options=SMALL_SET, runs_root=tmp_path)


def test_saved_canaries_reload_to_the_audited_set(task, records, tmp_path) -> None:
    from dp_textgrad.audit import load_canaries

    path = tmp_path / "auditor" / "canaries.json"
    result = run_canary_audit(task, engine(), DPESConfig(**SCHEDULE, insecure_noise_seed=5), records=records,
                              n_canaries=8, seed=7, options=SMALL_SET, runs_root=tmp_path / "runs",
                              canary_path=path, log=False)
    assert canary_fingerprint(load_canaries(path)) == result.audit["canaries"]["fingerprint_sha256"]
    assert [c.included for c in load_canaries(path)] == [c["included"] for c in result.audit["per_canary"]]


# -- the command line ---------------------------------------------------------------------------------
def one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize("args, fragment", [
    (["--canaries", "0"], "--canaries"),
    (["--canaries", "40", "--records", "20"], "--records"),
    (["--mode", "private"], "mode"),
    (["--threads", "0"], "--threads"),
    (["--population", "1"], "population"),
    (["--max-share", "2"], "max_share"),
    (["--unsafe-examples", "-1"], "--unsafe-examples"),
    (["--mode", "fewshot", "--demos", "0"], "--demos"),
    (["--mode", "fewshot", "--demos", "40", "--records", "32"], "--demos"),
])
def test_cli_bad_input_is_one_line_and_exit_2(monkeypatch, args, fragment) -> None:
    monkeypatch.setattr(EngineSection, "build", lambda section: pytest.fail("loaded an engine for bad input"))
    result = runner.invoke(main_cli.app, ["audit", "canaries", *args])
    assert result.exit_code == 2, result.output
    assert fragment in one_error_line(result)


def test_cli_runs_a_small_audit(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(EngineSection, "build", lambda section: engine())
    result = runner.invoke(main_cli.app, [
        "audit", "canaries", "--canaries", "10", "--records", "12", "--generations", "2", "--population", "3",
        "--parents", "1", "--references", "3", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "verdict: no violation shown" in result.output
    (run_dir,) = tmp_path.glob("run-*")
    assert read_audit(run_dir)["settings"]["max_share"] == 0.5
    # --unsafe-examples 0 (default): the unsafe control would show the whole private set, 12 + 10 at most;
    # the dp run records the same config (the field is unused outside unsafe mode)
    assert read_audit(run_dir)["settings"]["config"]["unsafe_examples"] == 22
    log = (tmp_path / "run_metadata.jsonl").read_text(encoding="utf-8")
    assert '"kind": "audit_l2"' in log and '"command": "audit canaries"' in log


def test_cli_fewshot_control_is_labelled_and_leaks(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(EngineSection, "build", lambda section: engine())
    result = runner.invoke(main_cli.app, [
        "audit", "canaries", "--mode", "fewshot", "--demos", "8", "--canaries", "12", "--records", "16",
        "--references", "3", "--require-leak", "--runs-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "NOT private" in result.output and "verdict: LEAK DETECTED" in result.output
    assert "member canaries among the 8 raw demonstrations" in result.output
    (run_dir,) = tmp_path.glob("run-*")
    assert read_audit(run_dir)["settings"]["fewshot"]["n_demos"] == 8
    report = runner.invoke(main_cli.app, ["report", str(run_dir)])
    assert report.exit_code == 0, report.output
    assert "mode: fewshot (positive control, NOT private" in (run_dir / "report.md").read_text(encoding="utf-8")


class _FakeResult:
    def __init__(self, run_dir: Path, violation: bool, leak: bool) -> None:
        self.run_dir, self.violation, self.leak_detected, self.seconds = run_dir, violation, leak, 0.0
        self.eps_lb = 9.0 if violation else 0.0
        self.verdict = "VIOLATION: test" if violation else "NO LEAK DETECTED: test"
        self.audit = {"canaries": {"n_members": 2, "n_nonmembers": 2}, "attacks": {},
                      "leakage": {"prompt_text": {"verbatim_members": 0, "verbatim_nonmembers": 0},
                                  "extraction": {"extracted_members": 0, "extracted_nonmembers": 0}},
                      "claim": {"epsilon": 1.0, "delta": 1e-5}, "gdp_estimate": None}


@pytest.mark.parametrize("mode, violation, leak, extra, code", [
    ("dp", True, False, [], 1),
    ("unsafe", False, False, ["--require-leak"], 1),
    ("unsafe", False, False, [], 0),
    ("unsafe", False, True, ["--require-leak"], 0),
    ("fewshot", False, False, ["--require-leak"], 1),
    ("fewshot", False, True, ["--require-leak"], 0),
])
def test_cli_exit_codes(monkeypatch, tmp_path, mode, violation, leak, extra, code) -> None:
    monkeypatch.setattr(EngineSection, "build", lambda section: engine())
    monkeypatch.setattr(audit_package, "run_canary_audit",
                        lambda *a, **k: _FakeResult(tmp_path, violation, leak))
    result = runner.invoke(main_cli.app, ["audit", "canaries", "--mode", mode, "--runs-dir", str(tmp_path), *extra])
    assert result.exit_code == code, result.output


# -- the local model --------------------------------------------------------------------------------
@pytest.mark.slow
def test_tiny_audit_with_the_local_model(llama_engine, tmp_path) -> None:
    task = make_support_task(seed=0, n_private=1, n_public=3, n_test=5)
    config = DPESConfig(epsilon=2.0, generations=1, population=2, parents=1, sampling_rate=0.5,
                        use_critiques=False, max_prompt_chars=400)
    options = CanaryAuditOptions(warn_share=0.5, max_share=0.5, n_exposure_references=3, top_ks=(5,))
    result = run_canary_audit(task, llama_engine, config, records=generate_support_examples(8, seed=1),
                              n_canaries=8, seed=0, options=options, runs_root=tmp_path)
    audit = result.audit
    assert audit["attacks"]["min_k_pp"]["available"]  # llama.cpp gives the vocabulary statistics
    assert not result.violation and result.eps_lb <= audit["claim"]["epsilon"]
    assert audit["leakage"]["prompt_text"]["verbatim_members"] == 0
    assert (result.run_dir / "plots" / "audit_roc.png").exists()
