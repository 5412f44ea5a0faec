"""Stand-ins the probes call upstream functions with: they record, and do nothing.

Probes run at ``import tfdist`` time, before a multi-worker program creates its
strategy (TF refuses to configure collectives once its context is initialised),
so they must create no tensors and need no cluster.
"""

from __future__ import annotations

import contextlib
from typing import Any


class RecordingStrategy:
    """Stands in for a strategy or distribution: records reduce/update calls, does nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.extended = self

    def reduce(self, reduce_op: Any, value: Any, axis: Any = None) -> Any:
        self.calls.append(("reduce", axis))
        return value

    def update(
        self, var: Any, fn: Any, args: Any = (), kwargs: Any = None, group: bool = True
    ) -> None:
        self.calls.append(("update", var))

    def experimental_local_results(self, value: Any) -> tuple:
        return tuple(getattr(value, "values", (value,)))

    def scope(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()
