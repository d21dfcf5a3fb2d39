"""``python -m dp_textgrad.cli ...``: the ``dp-textgrad`` command."""

from dp_textgrad.cli import app

app()
