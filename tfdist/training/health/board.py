"""The tasks' shared board: each task's health state and the watchdog's alarm, by key.

In TF's coordination service's key-value store when the cluster has one
(MultiWorkerMirrored), so that it is read and written while the training
thread waits in a collective; else in this process alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tfdist import _compat

_PREFIX = "tfdist/health/"


class Board:
    """The tasks' states, by label: in TF's coordination service, or in this process.

    Args:
        labels: Every task that publishes (``"worker:0"``, ...).
        shared: Whether to use the coordination service's key-value store.
    """

    def __init__(self, labels: Sequence[str], *, shared: bool) -> None:
        self.labels = list(labels)
        self.shared = shared
        self._local: dict[str, str] = {}

    def put(self, key: str, value: dict[str, Any]) -> None:
        text = json.dumps(value)
        if self.shared:
            _compat.key_value_set(_PREFIX + key, text)
        else:
            self._local[key] = text

    def claim(self, key: str, value: dict[str, Any]) -> dict[str, Any] | None:
        """Sets ``key`` unless a task set it first; returns None if set here, else its value.

        Two tasks may find a hang in the same second: exactly one claims it.
        """
        text = json.dumps(value)
        if self.shared:
            if _compat.key_value_insert(_PREFIX + key, text):
                return None
            first = self.get(key, 100)
            if first is not None:
                return first
            self.put(key, value)  # deleted meanwhile: it was an earlier fit's
            return None
        if key in self._local:
            return json.loads(self._local[key])
        self._local[key] = text
        return None

    def get(self, key: str, timeout_ms: int = 1) -> dict[str, Any] | None:
        text = (
            _compat.key_value_get(_PREFIX + key, timeout_ms)
            if self.shared
            else self._local.get(key)
        )
        return None if text is None else json.loads(text)

    def states(self) -> dict[str, dict[str, Any]]:
        """Every task's last state (tasks that never published are left out)."""
        found = {label: self.get(f"task/{label}", 200) for label in self.labels}
        return {label: s for label, s in found.items() if s is not None}
