"""The engine registry: what the CLI can build, its errors, and that it loads nothing heavy."""

from __future__ import annotations

import typing

import pytest

from dp_textgrad.engines.registry import ENGINES, build_engine
from dp_textgrad.settings import EngineSection
from tests.subprocess_driver import run_driver


def test_the_settings_offer_exactly_the_registered_engines() -> None:
    offered = typing.get_args(EngineSection.model_fields["kind"].annotation)
    assert set(offered) == set(ENGINES)
    assert "scripted" not in ENGINES  # tests only, never a user's choice


def test_unknown_kind_names_the_field_and_the_choices() -> None:
    with pytest.raises(ValueError, match=r"engine.kind: unknown engine 'gpt5'; use one of \['llama_cpp', 'openai'"):
        build_engine("gpt5")


def test_rejected_options_name_the_field() -> None:
    with pytest.raises(ValueError, match="engine.options: not accepted by the openai engine"):
        build_engine("openai", model="m", base_url="http://127.0.0.1:9/v1", no_such_option=1)


def test_reading_the_registry_loads_no_engine_library() -> None:
    imports = "import sys, dp_textgrad.engines.registry"
    code = ("print([m for m in ('llama_cpp', 'torch', 'transformers', 'dp_textgrad.engines.openai_engine',\n"
            "                   'dp_textgrad.engines.transformers_engine') if m in sys.modules])")
    out = run_driver(imports, code).stdout.strip()
    assert out == "[]"
