"""Prompt data: file/hub loaders and built-in generated tasks, all producing `Sample`s."""

from hone.data.datasets import load_samples
from hone.data.errors import HoneDataError
from hone.data.preferences import PreferencePair, load_preferences
from hone.data.tasks import TASKS, Arithmetic, Countdown, Task, WordProblems, get_task, register_task

__all__ = [
    "TASKS",
    "Arithmetic",
    "Countdown",
    "HoneDataError",
    "PreferencePair",
    "Task",
    "WordProblems",
    "get_task",
    "load_preferences",
    "load_samples",
    "register_task",
]
