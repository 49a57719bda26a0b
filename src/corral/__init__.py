"""corral: parallel task management for Python.

Decides who runs, how many run, in what order, and what happens when a run
dies half-way. See README.md for a tour and docs/architecture.md for the map.
"""

from corral.app import App, Handle, Node, TaskDef
from corral.core.groups import subgroup
from corral.core.levels import Level
from corral.core.retries import Backoff
from corral.core.states import State
from corral.engine.context import Context
from corral.engine.hooks import Hooks
from corral.errors import (
    AppClosed,
    BadArguments,
    Canceled,
    Cancelled,
    ChildFailed,
    ConfigError,
    CorralError,
    GroupDeadlock,
    IllegalTransition,
    PermanentError,
    QueueFull,
    ResultTimeout,
    Retry,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
    SubmitError,
    TaskFailed,
    TaskNotFound,
    TaskSignal,
    UnknownTask,
    WorkerFailed,
)
from corral.stores.base import Event

__version__ = "0.1.0"

__all__ = [
    "App",
    "Handle",
    "Node",
    "TaskDef",
    "State",
    "Context",
    "Backoff",
    "Level",
    "subgroup",
    "CorralError",
    "ConfigError",
    "SubmitError",
    "UnknownTask",
    "BadArguments",
    "QueueFull",
    "AppClosed",
    "StoreError",
    "StoreUnavailable",
    "StoreCorrupt",
    "WorkerFailed",
    "IllegalTransition",
    "TaskNotFound",
    "ResultTimeout",
    "TaskFailed",
    "GroupDeadlock",
    "Retry",
    "PermanentError",
    "Canceled",
    "Cancelled",
    "ChildFailed",
    "TaskSignal",
    "Hooks",
    "Event",
]
