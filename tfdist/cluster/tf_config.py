"""TF_CONFIG -> a validated `ClusterInfo` (pure Python, no TensorFlow).

Every problem raises one ``ValueError`` worded by `tfdist.config.invalid_argument`, naming
the offending field, e.g. ``TF_CONFIG.cluster.worker[1]``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tfdist.cluster.environment import ClusterEnvironment
from tfdist.cluster.info import MISSING, VALID_TASK_TYPES, ClusterInfo
from tfdist.cluster.ports import split_address
from tfdist.config import invalid_argument

_TASK_EXAMPLE = "a dict like {'type': 'worker', 'index': 0}"


class TFConfigEnvironment(ClusterEnvironment):
    """A cluster described by the TF_CONFIG variable.

    This is also the Kubernetes environment: Kubeflow's training operator (TFJob) sets
    TF_CONFIG in every pod, and the indexed Job that ``tfdist manifest kubernetes`` writes
    exports it too. So does ``tfdist launch``, for each task it starts.
    """

    name = "TF_CONFIG"

    def detect(self, environ: Mapping[str, str]) -> bool:
        """True when TF_CONFIG is set and not blank."""
        return bool(environ.get("TF_CONFIG", "").strip())

    def cluster_info(self, environ: Mapping[str, str]) -> ClusterInfo:
        """Parses and validates TF_CONFIG (see `parse_tf_config`)."""
        info = parse_tf_config(environ.get("TF_CONFIG"))
        if info is None:  # Only when detect() was skipped.
            raise invalid_argument(
                "TF_CONFIG",
                environ.get("TF_CONFIG", MISSING),
                "a JSON object with keys 'cluster' and 'task'",
            )
        return info


def parse_tf_config(raw: str | dict | None) -> ClusterInfo | None:
    """Parses and validates TF_CONFIG.

    Args:
        raw: The TF_CONFIG JSON string, an already-decoded dict, or None.

    Returns:
        The validated `ClusterInfo`, or None when ``raw`` is None or empty.

    Raises:
        ValueError: If TF_CONFIG is malformed; the message names the bad field.
    """
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    config = _decode(raw)
    cluster = _validate_cluster(config.get("cluster", MISSING))
    task_type, task_id = _validate_task(config.get("task", MISSING), cluster)
    rpc_layer = config.get("rpc_layer", "grpc")
    if not isinstance(rpc_layer, str) or not rpc_layer:
        raise invalid_argument(
            "TF_CONFIG.rpc_layer", rpc_layer, "a non-empty string such as 'grpc'"
        )
    return ClusterInfo(cluster=cluster, task_type=task_type, task_id=task_id, rpc_layer=rpc_layer)


def _decode(raw: str | dict) -> dict:
    """TF_CONFIG as a dict: ``raw`` decoded from JSON, or as given; checked to be an object."""
    if isinstance(raw, str):
        try:
            config = json.loads(raw)
        except json.JSONDecodeError as e:
            raise invalid_argument(
                "TF_CONFIG",
                raw,
                "a JSON object",
                note=f"JSON error: {e.msg} at line {e.lineno} column {e.colno} (char {e.pos}).",
            ) from None
    elif isinstance(raw, dict):
        config = raw
    else:
        raise invalid_argument("TF_CONFIG", raw, "a JSON string, a dict or None")
    if not isinstance(config, dict):
        raise invalid_argument("TF_CONFIG", config, "a JSON object with keys 'cluster' and 'task'")
    return config


def _validate_cluster(cluster: Any) -> dict[str, list[str]]:
    """Checks TF_CONFIG.cluster and returns a copy of it."""
    if not isinstance(cluster, dict) or not cluster:
        raise invalid_argument(
            "TF_CONFIG.cluster",
            cluster,
            "a non-empty dict mapping task types to lists of 'host:port' addresses",
        )
    unknown = sorted(str(t) for t in cluster if t not in VALID_TASK_TYPES)
    if unknown:
        raise invalid_argument(
            "TF_CONFIG.cluster",
            cluster,
            "task types from: " + ", ".join(VALID_TASK_TYPES),
            note=f"Unknown task type(s): {', '.join(unknown)}.",
        )
    seen: dict[str, str] = {}
    result = {}
    for task_type, addresses in cluster.items():
        name = f"TF_CONFIG.cluster.{task_type}"
        if not isinstance(addresses, list) or not addresses:
            raise invalid_argument(name, addresses, "a non-empty list of 'host:port' strings")
        if task_type == "chief" and len(addresses) > 1:
            raise invalid_argument(
                name,
                addresses,
                "a list with exactly one address",
                note="A cluster has at most one chief.",
            )
        for i, address in enumerate(addresses):
            task_name = f"{task_type}[{i}]"  # A field path (TF_CONFIG.cluster.worker[1]), no label.
            _check_address(f"TF_CONFIG.cluster.{task_name}", address)
            # Two tasks on one address would both try to serve it; the second fails deep in gRPC.
            if address in seen:
                raise invalid_argument(
                    f"TF_CONFIG.cluster.{task_name}",
                    address,
                    "an address used by exactly one task",
                    note=f"TF_CONFIG.cluster.{seen[address]} has the same address.",
                )
            seen[address] = task_name
        result[task_type] = list(addresses)
    return result


def _validate_task(task: Any, cluster: dict[str, list[str]]) -> tuple[str, int]:
    """Checks TF_CONFIG.task against the cluster and returns its type and index."""
    if not isinstance(task, dict):
        raise invalid_argument("TF_CONFIG.task", task, _TASK_EXAMPLE)
    task_type = task.get("type", MISSING)
    # An evaluator may sit outside TF_CONFIG.cluster (TF's multi_worker_util allows it too).
    if not isinstance(task_type, str) or (task_type not in cluster and task_type != "evaluator"):
        raise invalid_argument(
            "TF_CONFIG.task.type",
            task_type,
            sorted(cluster),
            note="The task type must be one of the task types in TF_CONFIG.cluster.",
        )
    task_id = task.get("index", MISSING)
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        raise invalid_argument("TF_CONFIG.task.index", task_id, "an integer")
    size = len(cluster.get(task_type, [])) or 1  # An evaluator outside the cluster is one task.
    if not 0 <= task_id < size:
        raise invalid_argument(
            "TF_CONFIG.task.index",
            task_id,
            f"an integer in the range [0, {size - 1}]",
            note=f"TF_CONFIG.cluster.{task_type} has {size} task(s).",
        )
    return task_type, task_id


def _check_address(name: str, address: Any) -> None:
    if not isinstance(address, str) or split_address(address) is None:
        raise invalid_argument(
            name,
            address,
            "a 'host:port' string with an integer port in 1..65535",
            note="Write IPv6 hosts in brackets, e.g. '[::1]:2222'.",
        )
