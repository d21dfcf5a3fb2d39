"""FeedbackSanitiser (hygiene: PII scrubbing, length, provenance) and render_confusion."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dp_textgrad.dp_es.mutation import FeedbackSanitiser, render_confusion, scrub_pii, truncate_text
from dp_textgrad.privacy.data import Private, PrivateDataError, PrivateDataset, PublicText

LABELS = ["billing", "refund", "technical"]
# An address has a domain ending in a top-level domain of letters: "0000@0..." (a cut
# that ends in "...") is not one, and the earlier looser pattern flagged it (hypothesis found it).
EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)*\.[A-Za-z]{2,}")


@pytest.mark.parametrize(
    "raw, placeholder, secret",
    [
        ("Write to jane.doe+shop@example.co.uk today", "[email]", "jane.doe"),
        ("Call +1 (555) 123-4567 after six", "[phone]", "123-4567"),
        ("my number is 020 7946 0958", "[phone]", "7946"),
        ("card 4111111111111111 was charged", "[number]", "4111111111111111"),
        ("zip 94107 is wrong", "[number]", "94107"),
        ("account ACC-88213-XZ is locked", "[id]", "88213"),
        ("IBAN GB82WEST12345698765432 attached", "[id]", "GB82WEST"),
        ("ticket #48213 reopened", "[id]", "48213"),
        ("ship it to 42 Elm Street, Apt 4B please", "[address]", "Elm Street"),
        ("I live at 1600 pennsylvania ave.", "[address]", "pennsylvania"),
        ("see https://example.com/orders?id=7 now", "[url]", "example.com"),
    ],
)
def test_scrub_pii_replaces_each_kind(raw, placeholder, secret):
    scrubbed, counts = scrub_pii(raw)
    assert placeholder in scrubbed
    assert secret not in scrubbed
    assert sum(counts.values()) >= 1


@pytest.mark.parametrize(
    "text",
    [
        "About 18% of 'refund' messages are labelled 'billing'.",
        "Answer with exactly one of: billing, refund, technical.",
        "Messages from 2023 about MP3 players are technical.",
        "Overall, about 71% of messages get the right label.",
    ],
)
def test_scrub_pii_leaves_ordinary_feedback_alone(text):
    scrubbed, counts = scrub_pii(text)
    assert scrubbed == text
    assert counts == {}


def test_keep_terms_protect_public_label_names():
    assert scrub_pii("label tier12ab is wrong")[0] == "label [id] is wrong"
    assert scrub_pii("label tier12ab is wrong", keep_terms=["tier12ab"])[0] == "label tier12ab is wrong"


def test_sanitiser_enforces_provenance():
    s = FeedbackSanitiser()
    with pytest.raises(PrivateDataError, match="not declared public"):
        s.sanitise("plain text")
    with pytest.raises(PrivateDataError, match="private"):
        s.sanitise(Private("a private record"))
    with pytest.raises(PrivateDataError):
        s.sanitise(PrivateDataset(["x"]))
    with pytest.raises(PrivateDataError, match="unsafe"):
        s.sanitise(PublicText("raw record text", "unsafe"))
    only_dp = FeedbackSanitiser(allowed_sources={"dp"})
    with pytest.raises(PrivateDataError, match="llm"):
        only_dp.sanitise(PublicText("some advice", "llm"))
    assert only_dp.sanitise(PublicText("About 5% wrong.", "dp")) == "About 5% wrong."


def test_unsafe_mode_allows_unsafe_source_and_public_mode_cannot_be_configured_to():
    unsafe = FeedbackSanitiser(mode="unsafe")
    out = unsafe.sanitise(PublicText("raw record from bob@example.com", "unsafe"))
    assert out.source == "unsafe" and "[email]" in out
    with pytest.raises(ValueError, match="unsafe"):
        FeedbackSanitiser(allowed_sources={"dp", "unsafe"})
    with pytest.raises(ValueError, match="allowed_sources"):
        FeedbackSanitiser(allowed_sources={"dp", "secret"})


def test_sanitise_keeps_source_strips_tags_and_truncates():
    s = FeedbackSanitiser(max_chars=40)
    out = s.sanitise(PublicText("Use </PROMPT> tags <PROMPT> and \x00 then write a much longer sentence here.", "llm"))
    assert isinstance(out, PublicText) and out.source == "llm"
    assert "PROMPT" not in out and "\x00" not in out
    assert len(out) <= 40 and out.endswith("...")
    assert s.sanitise(PublicText("  \n ", "llm")) is None


def test_sanitise_all_drops_empties_and_repeats():
    s = FeedbackSanitiser()
    items = [PublicText("Be specific.", "llm"), PublicText("be   SPECIFIC.", "llm"), PublicText(" ", "dp"),
             PublicText("About 5% wrong.", "dp")]
    assert s.sanitise_all(items) == ["Be specific.", "About 5% wrong."]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=600), st.integers(min_value=10, max_value=200))
def test_sanitised_text_is_bounded_and_has_no_email(text, max_chars):
    s = FeedbackSanitiser(max_chars=max_chars)
    out = s.sanitise(PublicText(text + " contact a.b@mail.example.org", "llm"))
    assert out is None or (len(out) <= max_chars and not EMAIL.search(out))


@given(st.text(max_size=300), st.integers(min_value=4, max_value=100))
def test_truncate_text_never_exceeds_limit(text, limit):
    assert len(truncate_text(text, limit)) <= limit


def test_render_confusion_known_matrix_without_noise():
    m = np.array([[40, 5, 5], [18, 80, 2], [0, 0, 50]], dtype=float)
    out = render_confusion(m, LABELS)
    assert all(isinstance(s, PublicText) and s.source == "dp" for s in out)
    assert out[0] == "Overall, about 85% of messages get the right label."
    assert "About 18% of 'refund' messages are labelled 'billing'." in out
    assert "About 10% of 'billing' messages are labelled 'refund'." in out
    assert "About 10% of 'billing' messages are labelled 'technical'." in out
    # 2/100 = 2% is below min_fraction
    assert not any("'refund' messages are labelled 'technical'" in s for s in out)
    # the largest confusion comes first after the overall sentence
    assert out[1] == "About 18% of 'refund' messages are labelled 'billing'."


def test_render_confusion_ignores_cells_below_the_noise_floor():
    m = np.array([[40, 5, 5], [18, 80, 2], [0, 0, 50]], dtype=float)
    out = render_confusion(m, LABELS, noise_std=3.0)  # threshold 6: the 5s and the 2 are noise
    confusions = [s for s in out if s.startswith("About")]
    assert confusions == ["About 18% of 'refund' messages are labelled 'billing'."]


def test_render_confusion_clips_negative_counts_and_uses_public_denominator():
    m = np.array([[30, -12, 0], [-4, 30, 10], [0, 0, 30]], dtype=float)
    out = render_confusion(m, LABELS, expected_batch_size=180)
    assert out[0] == "Overall, about 50% of messages get the right label."
    assert not any("-" in s for s in out)
    assert "About 25% of 'refund' messages are labelled 'technical'." in out


def test_render_confusion_reports_over_predicted_label():
    m = np.array([[30, 0, 0], [25, 5, 0], [20, 0, 10]], dtype=float)
    out = render_confusion(m, LABELS)
    assert any(s.startswith("'billing' is predicted much more often than it occurs") for s in out)
    assert not any(s.startswith("'refund' is predicted") for s in out)


def test_render_confusion_pure_noise_says_nothing_specific():
    rng = np.random.default_rng(0)
    m = rng.normal(0.0, 5.0, size=(3, 3))
    out = render_confusion(m, LABELS, noise_std=5.0, threshold_stds=3.0)
    assert not any("labelled" in s for s in out)


def test_render_confusion_limits_and_validation():
    m = np.array([[40, 5, 5], [18, 80, 2], [0, 0, 50]], dtype=float)
    assert len(render_confusion(m, LABELS, max_sentences=2)) == 2
    with pytest.raises(ValueError, match="shape"):
        render_confusion(np.zeros((2, 2)), LABELS)
    with pytest.raises(ValueError, match="nan"):
        render_confusion(np.full((3, 3), np.nan), LABELS)
    with pytest.raises(ValueError, match="expected_batch_size"):
        render_confusion(m, LABELS, expected_batch_size=0)
    assert render_confusion(np.zeros((3, 3)), LABELS) == []



def test_an_address_at_the_cut_does_not_survive() -> None:
    # The address is scrubbed before the cut, so no prefix of it is left at the end.
    for limit in range(10, 40):
        out = FeedbackSanitiser(max_chars=limit).sanitise(PublicText("Write to a.b@mail.example.org today", "llm"))
        assert out is None or ("a.b@" not in str(out) and not EMAIL.search(str(out)))
    assert EMAIL.search("contact a.b@mail.example.org") and not EMAIL.search("0000@0...")
