"""Progress of an integration's run (a DSPy compile, a GEPA call), as DSPy shows its own: a tqdm
bar over the generations and one log line per generation.

It is a run observer (:mod:`dp_textgrad.run_events`), so it sees released values only: the
schedule and the public N at the start, then each generation's best DP estimate and the epsilon
spent so far. Never a timing or count of the private phase: the bar's rate and elapsed time are
off, since how long a generation took depends on the private records it read.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from dp_textgrad.privacy.accounting.bounds import format_epsilon


class RunProgress:
    """A run observer that draws a progress bar and logs each generation (module docstring).

    ``name``: what runs (``"DPES compile"``); ``logger``: where the log lines go; ``bar``: draw the
    tqdm bar (on stderr) as well as logging."""

    def __init__(self, name: str, logger: logging.Logger, *, bar: bool = True) -> None:
        self.name = name
        self.logger = logger
        self.show_bar = bar
        self._bar: Any = None
        self._generations = 0

    def on_start(self, event: Any) -> None:
        config = event.config
        self._generations = int(config.generations)
        self.logger.info(
            "%s: %d generations of %d candidates, epsilon %s, delta %s (%s)%s",
            self.name,
            config.generations,
            config.population,
            format_epsilon(config.epsilon),
            "the default" if config.delta is None else f"{config.delta:g}",
            event.mechanism,
            f", resumed at generation {event.generation}" if event.resumed else "",
        )
        if self.show_bar:
            from tqdm.auto import tqdm  # tqdm comes with the dspy and gepa extras' dependencies

            # No rate, no elapsed time: both would time the private phase. A redraw on every update
            # and never on a timer (mininterval 0, miniters 1): how often tqdm redraws by the clock
            # would time it too.
            self._bar = tqdm(
                total=self._generations,
                initial=int(event.generation),
                desc=self.name,
                unit="generation",
                bar_format="{desc}: {n_fmt}/{total_fmt} generations |{bar}|{postfix}",
                file=sys.stderr,
                leave=True,
                mininterval=0,
                miniters=1,
            )

    def on_generation(self, report: Any) -> None:
        spent = format_epsilon(report.epsilon_spent)
        self.logger.info(
            "%s: generation %d/%d, best noisy estimate %.3f, epsilon spent %s",
            self.name,
            report.generation + 1,
            self._generations,
            report.best_estimate,
            spent,
        )
        if self._bar is not None:
            self._bar.set_postfix_str(f"best {report.best_estimate:.3f}, epsilon spent {spent}", refresh=False)
            self._bar.update(1)

    def on_finish(self, event: Any) -> None:
        self._close()
        self.logger.info(
            "%s: released the prompt at epsilon %s (run %s)",
            self.name,
            format_epsilon(event.result.epsilon),
            event.run_dir.name,
        )

    def on_fail(self, event: Any) -> None:
        self._close()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


__all__ = ["RunProgress"]
