"""An OpenAI-compatible server that cannot be reached fails the preflight at once, before any charge.

Retries with back-off are for transient failures of a server that answers; a ``base_url``
where nothing listens is a setting to fix, so ``dp-textgrad optimize`` says so within
seconds (exit 1) and leaves a run directory that ``--resume`` explains.
"""

from __future__ import annotations

import socket
import time

import pytest
from typer.testing import CliRunner

from dp_textgrad import cli
from dp_textgrad.dp_es.preflight import PreflightError, preflight
from dp_textgrad.engines.openai_engine import OpenAIEngine
from dp_textgrad.tasks.synthetic import make_support_task
from tests.servers import server_error

runner = CliRunner()


def closed_loopback_url() -> str:
    """A URL on a loopback port that was just free: connecting to it is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_optimize_with_an_unreachable_base_url_fails_the_preflight_at_once(tmp_path) -> None:
    url = closed_loopback_url()
    runs_root = tmp_path / "runs"
    args = ["optimize", "--engine", "openai", "--base-url", url, "--model", "m", "--runs-root", str(runs_root),
            "--generations", "1", "--population", "2", "--parents", "1"]
    started = time.monotonic()
    result = runner.invoke(cli.app, args)
    elapsed = time.monotonic() - started
    assert result.exit_code == 1, (result.exit_code, result.stderr, result.exception)
    error = result.stderr
    assert "engine.base_url" in error and url in error and "before anything was charged" in error, error
    assert "check" in error and "running" in error, error
    assert elapsed < 10, f"took {elapsed:.1f} s: an unreachable server should fail at once, not after retries"
    runs = [path for path in runs_root.glob("run-*") if path.is_dir()]
    assert len(runs) <= 1
    if runs:  # a run directory left behind is one that --resume explains
        again = runner.invoke(cli.app, ["optimize", "--resume", str(runs[0])])
        assert again.exit_code == 2, again.stderr
        assert "nothing was spent" in again.stderr and "dp-textgrad optimize" in again.stderr, again.stderr
        assert "is this a run directory" not in again.stderr


def test_preflight_names_the_unreachable_server_without_retrying() -> None:
    url = closed_loopback_url()
    engine = OpenAIEngine("m", base_url=url, mode="completions", max_retries=5, backoff_base=2.0)
    task = make_support_task(n_private=20, n_test=5)
    started = time.monotonic()
    with pytest.raises(PreflightError, match=r"engine\.base_url") as error:
        preflight(engine, task, task.seed_prompt, 64)
    assert time.monotonic() - started < 5  # one back-off alone would be 2 s or more
    assert engine.usage.retries == 0 and url in str(error.value)
    engine.close()


def test_a_server_that_answers_keeps_its_retries_for_transient_errors(fault_server) -> None:
    # The reachability check is one GET; a transient 500 on the probe itself is retried as before.
    fault_server.script(server_error(500))
    engine = OpenAIEngine("fake-model", base_url=fault_server.base_url, mode="completions", max_retries=2,
                          backoff_base=0.01)
    task = make_support_task(n_private=20, n_test=5)
    preflight(engine, task, task.seed_prompt, 64)
    assert engine.usage.retries == 1 and fault_server.pending_faults == 0
    engine.close()
