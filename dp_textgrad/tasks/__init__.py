"""Tasks: private training records, public records, a test split and a per-record score.

Two families follow one protocol (:class:`Task`): classification (:class:`ClassificationTask`)
and generation scored by a metric (:class:`GenerationTask`).
"""

from dp_textgrad.tasks.base import ClassificationTask, Example, FeedbackSpec, RecordOutcomes, Task
from dp_textgrad.tasks.generation import GenerationExample, GenerationTask

__all__ = [
    "ClassificationTask",
    "Example",
    "FeedbackSpec",
    "GenerationExample",
    "GenerationTask",
    "RecordOutcomes",
    "Task",
]
