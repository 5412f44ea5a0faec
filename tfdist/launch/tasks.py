"""What a launched task is: its name, the command and environment it runs with, how it ended;
and what a launch is (`LaunchSpec`: ``launch()``'s arguments as one object).

Shared by the node layout (`tfdist.launch.layout`: which tasks run on this
node), the supervisor (`tfdist.launch.supervisor`: runs them) and the job
files (`tfdist.launch.manifests`: the command every task runs). Pure
Python; no TensorFlow is imported here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from tfdist.cluster import parse_tf_config, task_label
from tfdist.config import invalid_argument

# The order tasks start in, and are listed in by summaries and layouts: the chief first, so
# that the parameter-server coordinator is up before the workers it will schedule on.
TASK_ORDER = ("chief", "worker", "ps", "evaluator")


@dataclass(frozen=True)
class Task:
    """One task of the cluster: ``Task("worker", 1)`` prints as ``worker:1``."""

    task_type: str
    task_id: int

    def __str__(self) -> str:
        return task_label(self.task_type, self.task_id)


@dataclass(frozen=True)
class LaunchSpec:
    """One launch, whole: `tfdist.launch.local.launch`'s arguments (see it for each), which
    the layout, the supervisor and the sandbox each read from here.

    ``output`` None means ``sys.stdout``; ``preload`` is the checked tuple of modules.
    """

    command: Sequence[str]
    workers: int
    ps: int = 0
    chief: bool = False
    evaluator: bool = False
    host: str = "127.0.0.1"
    allow_external: bool = False
    ports: Sequence[int] | None = None
    env: Mapping[str, str] | None = None
    output: TextIO | None = None
    timeout: float | None = None
    max_restarts: int = 0
    nnodes: int = 1
    node_rank: int = 0
    hosts: Sequence[str] | str | None = None
    private_network: bool = True
    pin: bool = True
    preload: Sequence[str] | str | None = None

    @property
    def single_node(self) -> bool:
        """Whether every task runs here: one node, no ``hosts``."""
        return self.hosts is None and self.nnodes == 1 and self.node_rank == 0


@dataclass
class TaskResult:
    """How one task's process ended.

    Attributes:
        task_type: The task type, e.g. ``worker``.
        task_id: The task index.
        returncode: The exit code, or None if it died by a signal or never ended.
        signal: The name of the signal that ended it (e.g. ``SIGTERM``), if any.
        stopped_by_launcher: True when the launcher ended it (failure elsewhere,
            timeout, Ctrl-C, or a parameter server no longer needed).
    """

    task_type: str
    task_id: int
    returncode: int | None
    signal: str | None
    stopped_by_launcher: bool = False

    def describe(self) -> str:
        """E.g. ``worker:1 exited with code 3`` or ``ps:0 terminated by launcher``."""
        name = task_label(self.task_type, self.task_id)
        if self.stopped_by_launcher:
            how = self.signal or (
                f"exit code {self.returncode}" if self.returncode is not None else ""
            )
            return f"{name} terminated by launcher" + (f" ({how})" if how else "")
        if self.signal is not None:
            return f"{name} killed by signal {self.signal}"
        return f"{name} exited with code {self.returncode}"


def all_tasks(cluster: Mapping[str, list[str]]) -> list[Task]:
    """Every task of ``cluster``, in `TASK_ORDER`."""
    return [Task(t, i) for t in TASK_ORDER for i in range(len(cluster.get(t, [])))]


def task_env(
    cluster: dict[str, list[str]],
    task_type: str,
    task_id: int,
    base_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Returns the environment for one task.

    Args:
        cluster: Task type -> list of ``"host:port"``.
        task_type: The task's type.
        task_id: The task's index.
        base_env: The environment to copy; defaults to ``os.environ``.

    Returns:
        A copy of ``base_env`` with TF_CONFIG set, PYTHONUNBUFFERED=1 and
        TF_CPP_MIN_LOG_LEVEL defaulting to ``"2"``.

    Raises:
        ValueError: If the cluster or the task is invalid.
    """
    info = parse_tf_config({"cluster": cluster, "task": {"type": task_type, "index": task_id}})
    env = dict(os.environ if base_env is None else base_env)
    env["TF_CONFIG"] = json.dumps(info.to_tf_config())
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # The supervisor prefixes output line by line: a task that buffers its stdout would show
    # nothing until it exits, and lose it all if it is killed.
    env["PYTHONUNBUFFERED"] = "1"
    return env


def check_command(command: Any) -> list[str]:
    """Returns ``command`` as a list if it is a non-empty list of strings, else raises.

    A single string is refused rather than split: ``"python train.py"`` would
    otherwise name a program that does not exist.
    """
    if (
        isinstance(command, (str, bytes))
        or not command
        or not all(isinstance(c, str) for c in command)
    ):
        raise invalid_argument(
            "command", command, "a non-empty list of strings, e.g. ['python', 'train.py']"
        )
    return list(command)
