"""The restart policy of ``tfdist launch``: what happens when a task fails.

Pure bookkeeping, no processes: `RestartPolicy` decides and counts, and
`tfdist.launch.supervisor.Supervisor` carries the decision out. On a
task that fails:

* exit code 75 (`PREEMPTED_EXIT_CODE`): it saved a backup
  on SIGTERM and asks for a restart, which does not count against
  ``max_restarts``;
* exit code 76 (`STUCK_EXIT_CODE`): the watchdog found a
  hang; a failure like any other (below), logged as such;
* otherwise, while restarts are left: under parameter servers the failed
  worker alone, else the whole group;
* no restarts left: a parameter-server worker is given up while other workers
  run (the coordinator goes on with them); anything else fails the job.
"""

from __future__ import annotations

import logging
from typing import Literal

from tfdist.config import PREEMPTED_EXIT_CODE
from tfdist.launch.tasks import Task, TaskResult

logger = logging.getLogger(__name__)

#: What the supervisor does with a failed task.
Action = Literal["restart_task", "restart_group", "go_on", "fail"]
# Preemptions do not use up max_restarts; this only stops a task that exits 75 in a loop
# from restarting forever.
MAX_PREEMPTIONS = 100


class RestartPolicy:
    """Decides what follows a failed task, and counts restarts and preemptions.

    Args:
        max_restarts: Restarts allowed after failures (preemptions aside).
        parameter_server_mode: Whether the cluster has parameter servers.

    Attributes:
        restarts: Restarts used so far.
        preemptions: Preemption restarts so far.
    """

    def __init__(self, *, max_restarts: int, parameter_server_mode: bool):
        self.max_restarts = max_restarts
        self.parameter_server_mode = parameter_server_mode
        self.restarts = 0
        self.preemptions = 0

    def decide(self, task: Task, result: TaskResult, *, workers_left: bool) -> Action:
        """Returns what to do about ``task``, which failed with ``result``, and logs why.

        Args:
            task: The failed task.
            result: How it ended (not exit code 0).
            workers_left: Whether other workers of this launch are still running.
        """
        if result.returncode == PREEMPTED_EXIT_CODE and self.preemptions < MAX_PREEMPTIONS:
            self.preemptions += 1
            if self.parameter_server_mode and task.task_type in ("worker", "chief"):
                # The ps and the other workers keep serving while the preempted task restarts.
                logger.warning(
                    "%s: preempted after saving a backup; restarting %s.", result.describe(), task
                )
                return "restart_task"
            logger.warning(
                "%s: preempted after saving a backup; restarting the whole group.",
                result.describe(),
            )
            return "restart_group"
        ps_worker = self.parameter_server_mode and task.task_type == "worker"
        if self.restarts < self.max_restarts:
            self.restarts += 1
            if ps_worker:
                # A PS worker holds no state: the coordinator reschedules its steps on the
                # others meanwhile and takes it back when it reconnects.
                logger.warning(
                    "%s; restarting %s alone (restart %d of %d).",
                    result.describe(),
                    task,
                    self.restarts,
                    self.max_restarts,
                )
                return "restart_task"
            # A collective (MultiWorkerMirrored) cannot lose a member: the survivors would wait
            # for it forever, so every task starts again (and restores the backup, if any).
            logger.warning(
                "%s; restarting the whole group (restart %d of %d).",
                result.describe(),
                self.restarts,
                self.max_restarts,
            )
            return "restart_group"
        if ps_worker and workers_left:
            logger.warning(
                "%s; no restarts left, the coordinator goes on with the other workers.",
                result.describe(),
            )
            return "go_on"
        return "fail"

    def failure_reason(self, result: TaskResult) -> str:
        """Why the job failed, e.g. ``worker:1 exited with code 3 after 1 of 1 restarts``."""
        if self.max_restarts:
            return f"{result.describe()} after {self.restarts} of {self.max_restarts} restarts"
        return result.describe()
