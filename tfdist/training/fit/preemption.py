"""Noting SIGTERM so that training stops at a step boundary, on every worker at the same one."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

logger = logging.getLogger(__name__)


class PreemptionWatcher:
    """Notes SIGTERM so the loop can stop at the next step boundary.

    Args:
        has_backup: Whether the run saves a backup before exiting for a
            restart (else it just stops); only changes the log message.
    """

    def __init__(self, *, has_backup: bool = True) -> None:
        self.requested = False
        self.has_backup = has_backup
        self._previous: Any = None

    def __enter__(self) -> PreemptionWatcher:
        # Python delivers signals to the main thread only; elsewhere (e.g. a notebook worker
        # thread) the handler cannot be installed and SIGTERM keeps its default action.
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.has_backup:
            logger.warning(
                "SIGTERM: saving a backup at the next step boundary, then exiting for a restart"
            )
        else:
            logger.warning(
                "SIGTERM: stopping at the next step boundary (no backup_dir, so nothing is saved)"
            )
        self.requested = True

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
