"""What the engine needs to know of a task definition, and nothing more.

``App`` keeps full task definitions (``corral.app.TaskDef``); the worker only
reads the fields below, through a mapping from task name to definition. So
the engine depends on no public-API module, and a test can hand it a plain
dict of stand-ins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from corral.core.retries import Backoff


class TaskSpec(Protocol):
    """How to run one task name."""

    @property
    def name(self) -> str: ...
    @property
    def fn(self) -> Callable[..., Any]: ...
    @property
    def isolation(self) -> str: ...  # "thread" or "process"
    @property
    def takes_ctx(self) -> bool: ...
    @property
    def retry_on(self) -> tuple[type[BaseException], ...] | None: ...
    @property
    def permanent_on(self) -> tuple[type[BaseException], ...]: ...
    @property
    def backoff(self) -> Backoff: ...
    @property
    def overlap_on_timeout(self) -> bool: ...  # a timed-out thread frees its lane at once


#: Task name -> definition. The worker claims only names found here.
Registry = Mapping[str, TaskSpec]
