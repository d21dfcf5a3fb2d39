"""Tasks: private training records, public records, a test split and a per-record score."""

from dp_textgrad.tasks.base import ClassificationTask, Example, RecordOutcomes

__all__ = ["ClassificationTask", "Example", "RecordOutcomes"]
