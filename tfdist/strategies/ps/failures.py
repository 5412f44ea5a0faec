"""How a parameter-server run's failures reach the user: which task failed, and what it means.

A failed ps task stops training (the variables live there) with a
``ParameterServerFailure`` naming it; a worker that stopped after running a
function only loses that function's logs (``lost_worker_output``). A stuck
worker is treated as lost (``ps_watchdog``), unless it was the last one left:
then the fit fails with ``WorkerStuckError``.
"""

from __future__ import annotations

import re

import tensorflow as tf

from tfdist.strategies.base import RunnerStuckError

_TASK_RE = re.compile(r"/job:(ps|worker|chief)/replica:\d+/task:(\d+)")


class ParameterServerFailure(RuntimeError):
    """A parameter server failed; training cannot go on without its variables."""


class WorkerStuckError(RunnerStuckError):
    """A worker's training call never finished and no other worker was left to run it.

    A `tfdist.strategies.base.RunnerStuckError`: the fit's watchdog exits on it."""


def raise_clearly(error: Exception) -> None:
    """Raises ``error``, as a ``ParameterServerFailure`` naming the task if a ps task failed."""
    text = str(error)
    match = _TASK_RE.search(text)
    if (match and match.group(1) == "ps") or "ps" in type(error).__name__.lower():
        task = f"ps:{match.group(2)}" if match else "a ps task"
        raise ParameterServerFailure(
            f"Parameter server {task} failed, so training stopped (the variables live there). "
            f"Restart the job; with backup_dir set it resumes from the last backup. Cause: "
            f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
        ) from error
    raise error


def lost_worker_output(error: Exception) -> str | None:
    """The worker whose finished function's outputs could not be fetched (it stopped), else None."""
    if not isinstance(error, (tf.errors.UnavailableError, tf.errors.CancelledError)):
        return None
    tasks = _TASK_RE.findall(str(error))
    workers = sorted({f"worker:{i}" for job, i in tasks if job == "worker"})
    return workers[0] if workers and not any(job == "ps" for job, _ in tasks) else None
