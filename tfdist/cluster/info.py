"""What every cluster environment produces (`ClusterInfo`); task labels; the chief rule."""

from __future__ import annotations

import copy
from dataclasses import dataclass

VALID_TASK_TYPES = ("chief", "worker", "ps", "evaluator")


class Missing:
    """Stands in for a key that is absent, so an error reads ``name=<missing>``."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING = Missing()  # The value `tfdist.config.invalid_argument` reports for an absent key.


def task_label(task_type: str, task_id: int) -> str:
    """The one way tfdist names a task in logs and temporary paths: ``"worker:1"``."""
    return f"{task_type}:{task_id}"


def is_chief_task(task_type: str | None, task_id: int, *, cluster_has_chief: bool) -> bool:
    """True for the chief, or for worker 0 of a cluster without a chief (TF's rule)."""
    if task_type == "chief":
        return True
    return task_type == "worker" and int(task_id) == 0 and not cluster_has_chief


@dataclass(frozen=True)
class ClusterInfo:
    """The cluster and this process's place in it, as TF_CONFIG describes them.

    Attributes:
        cluster: Task type -> list of ``"host:port"`` addresses.
        task_type: This task's type: ``chief``, ``worker``, ``ps`` or ``evaluator``.
        task_id: This task's index within ``cluster[task_type]``.
        rpc_layer: The RPC protocol TensorFlow uses between tasks.
    """

    cluster: dict[str, list[str]]
    task_type: str
    task_id: int
    rpc_layer: str = "grpc"

    @property
    def is_chief(self) -> bool:
        """True for the chief, or for worker 0 when the cluster has no chief."""
        return is_chief_task(
            self.task_type, self.task_id, cluster_has_chief=bool(self.cluster.get("chief"))
        )

    @property
    def num_workers(self) -> int:
        """The number of training workers: chief plus workers."""
        return len(self.cluster.get("chief", [])) + len(self.cluster.get("worker", []))

    @property
    def address(self) -> str:
        """This task's ``host:port``; ``""`` for an evaluator outside the cluster."""
        addresses = self.cluster.get(self.task_type, [])
        return addresses[self.task_id] if self.task_id < len(addresses) else ""

    def to_tf_config(self) -> dict:
        """Returns the TF_CONFIG dict (``json.dumps`` it for the environment)."""
        return {
            "cluster": copy.deepcopy(self.cluster),
            "task": {"type": self.task_type, "index": self.task_id},
            "rpc_layer": self.rpc_layer,
        }
