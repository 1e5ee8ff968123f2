"""Prompt data: file/hub loaders and built-in generated tasks, all producing `Sample`s."""

from hone.data.datasets import load_samples
from hone.data.errors import HoneDataError
from hone.data.preferences import PreferencePair, load_preferences
from hone.data.tasks import TASKS, Arithmetic, Countdown, Task, WordProblems, get_task, register_task

# Imported for its registration: `vlm_count` is in TASKS wherever hone.data (or any submodule) is imported.
from hone.data.vision_tasks import VlmCount

__all__ = [
    "TASKS",
    "Arithmetic",
    "Countdown",
    "HoneDataError",
    "PreferencePair",
    "Task",
    "VlmCount",
    "WordProblems",
    "get_task",
    "load_preferences",
    "load_samples",
    "register_task",
]
