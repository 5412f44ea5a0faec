"""``tfdist manifest kubernetes``: a Kubeflow TFJob, or an Indexed Job with a headless Service.

    tfdist manifest kubernetes --workers=2 --ps=1 --chief --image=IMAGE --output=job.yaml -- \\
        python train.py
    tfdist manifest kubernetes --kind=indexed-job --workers=4 --image=IMAGE -- python train.py

Nothing here talks to a cluster or imports TensorFlow: `tfjob` and
`indexed_job` return the resources as dicts, `kubernetes_manifest`
their YAML (written by PyYAML's safe dumper, for ``kubectl apply -f``).

How each pod learns its place in the cluster:

* ``tfjob``: the Kubeflow training operator sets TF_CONFIG itself.
* ``indexed-job``: a one-line shell prefix exports TF_CONFIG built from
  JOB_COMPLETION_INDEX, with the headless Service's DNS names
  ``NAME-INDEX.NAME:2222`` as the cluster, then ``exec``\\ s the command.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import yaml

from tfdist.config import check_non_negative_int, check_positive_int, invalid_argument
from tfdist.launch.tasks import check_command

KUBERNETES_KINDS = ("indexed-job", "tfjob")
TF_PORT = 2222  # The port Kubeflow's TFJob gives every replica ("tfjob-port").
JOB_LABEL = "tfdist-job"  # Pod label the indexed Job's headless Service selects.
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def tfjob(
    command: Sequence[str],
    *,
    workers: int,
    image: str,
    ps: int = 0,
    chief: bool = False,
    name: str = "tfdist",
) -> dict[str, Any]:
    """Returns a Kubeflow TFJob (``kubeflow.org/v1``) running ``command`` in every replica.

    The training operator sets each pod's TF_CONFIG. The job succeeds when the
    chief (or worker 0 without a chief) succeeds.

    Args:
        command: The container's command and arguments.
        workers: Worker replicas (>= 1).
        image: The container image, e.g. ``"registry.example/train:1"``.
        ps: Parameter-server replicas (>= 0).
        chief: Whether to add a Chief replica (the coordinator with ``ps``).
        name: The TFJob's name, a DNS label.

    Returns:
        The manifest as a dict (see `to_yaml`).

    Raises:
        ValueError: On a bad argument.
    """
    command = check_command(command)
    check_positive_int("workers", workers)
    check_non_negative_int("ps", ps)
    counts = {"Chief": int(bool(chief)), "Worker": workers, "PS": ps}
    _check_name(name, max((f"-{t.lower()}-{n - 1}" for t, n in counts.items() if n), key=len))
    container = _container(image, command[:1], command[1:])
    replicas = {
        t: {
            "replicas": n,
            "restartPolicy": "OnFailure",
            "template": {"spec": {"containers": [container]}},
        }
        for t, n in counts.items()
        if n
    }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name},
        "spec": {"tfReplicaSpecs": replicas},
    }


def indexed_job(
    command: Sequence[str], *, workers: int, image: str, name: str = "tfdist"
) -> list[dict[str, Any]]:
    """Returns a headless Service and an Indexed ``batch/v1`` Job of ``workers`` pods.

    Needs no operator. Pod ``i`` is worker ``i`` of an all-worker cluster
    (MultiWorkerMirrored; worker 0 is the chief) whose addresses are the
    Service's DNS names ``NAME-0.NAME:2222``, ``NAME-1.NAME:2222``, ...; a shell
    prefix exports that TF_CONFIG, with JOB_COMPLETION_INDEX as the task index,
    and then ``exec``\\ s ``command``. Any failed pod fails the Job
    (``backoffLimit: 0``), which stops the others.

    Args:
        command: The container's command and arguments.
        workers: Pods, i.e. workers (>= 1).
        image: The container image.
        name: The Job's and the Service's name, a DNS label.

    Returns:
        ``[service, job]`` as dicts (see `to_yaml`).

    Raises:
        ValueError: On a bad argument.
    """
    command = check_command(command)
    check_positive_int("workers", workers)
    _check_name(name, f"-{workers - 1}")
    script = _tf_config_prefix(name, workers)
    service = _headless_service(name)
    return [service, _indexed_job(name, workers, image, script, command)]


def _tf_config_prefix(name: str, workers: int) -> str:
    """The shell prefix that exports pod JOB_COMPLETION_INDEX's TF_CONFIG, then runs the command."""
    cluster = {"worker": [f"{name}-{i}.{name}:{TF_PORT}" for i in range(workers)]}
    # TF_CONFIG of worker 0 without its '0}}': the shell appends the pod's index and the '}}'.
    prefix = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})[:-3]
    return f"export TF_CONFIG='{prefix}'\"$JOB_COMPLETION_INDEX\"'}}}}' && exec \"$@\""


def _headless_service(name: str) -> dict[str, Any]:
    """The headless Service that gives each pod of Job ``name`` its DNS name, ready or not."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {JOB_LABEL: name},
            "ports": [{"name": "tfjob-port", "port": TF_PORT, "targetPort": TF_PORT}],
        },
    }


def _indexed_job(
    name: str, workers: int, image: str, script: str, command: list[str]
) -> dict[str, Any]:
    """The Indexed Job of ``workers`` pods, each running ``command`` after ``script``."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": workers,
            "parallelism": workers,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {JOB_LABEL: name}},
                "spec": {
                    "subdomain": name,
                    "restartPolicy": "Never",
                    "containers": [
                        _container(image, ["/bin/sh", "-c", script, "tfdist-task"], command)
                    ],
                },
            },
        },
    }


def kubernetes_manifest(
    command: Sequence[str],
    *,
    workers: int,
    image: str,
    ps: int = 0,
    chief: bool = False,
    name: str = "tfdist",
    kind: Literal["tfjob", "indexed-job"] = "tfjob",
) -> str:
    """Returns the YAML of `tfjob` or `indexed_job`.

    Args:
        command: The container's command and arguments.
        workers: Worker replicas (>= 1).
        image: The container image.
        ps: Parameter-server replicas; ``tfjob`` only.
        chief: Whether to add a chief; ``tfjob`` only.
        name: The resources' name, a DNS label.
        kind: ``tfjob`` (Kubeflow training operator) or ``indexed-job`` (plain
            Kubernetes, MultiWorkerMirrored only).

    Raises:
        ValueError: On a bad argument, or ``ps``/``chief`` with ``indexed-job``.
    """
    if kind not in KUBERNETES_KINDS:
        raise invalid_argument("kind", kind, KUBERNETES_KINDS)
    if kind == "tfjob":
        return to_yaml(
            [tfjob(command, workers=workers, image=image, ps=ps, chief=chief, name=name)]
        )
    for arg, value, default in (("ps", ps, 0), ("chief", chief, False)):
        if value != default:
            raise invalid_argument(
                arg,
                value,
                f"{default!r} with kind='indexed-job'",
                note="An Indexed Job runs an all-worker (MultiWorkerMirrored) cluster and "
                "completes only when every pod exits, which parameter servers never do; "
                "use kind='tfjob'.",
            )
    return to_yaml(indexed_job(command, workers=workers, image=image, name=name))


def to_yaml(documents: Sequence[Mapping[str, Any]]) -> str:
    """Writes dicts as a multi-document YAML stream, block style, keys in the dicts' order.

    Scalars that YAML would read as another type (``"yes"``, ``"1.5"``, ``"null"``)
    are quoted, so every value reads back as written.
    """
    # sort_keys=False keeps Kubernetes' reading order (apiVersion, kind, metadata, spec); an
    # unbounded width keeps long strings (the indexed Job's shell prefix) on one line.
    return yaml.dump_all(
        [dict(doc) for doc in documents],
        Dumper=_NoAliasDumper,
        sort_keys=False,
        default_flow_style=False,
        width=float("inf"),
    )


class _NoAliasDumper(yaml.SafeDumper):
    """PyYAML's safe dumper, writing a dict used twice (one container for every replica) out
    in full each time rather than as a ``&id001`` anchor and ``*id001`` aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _container(image: str, command: list[str], args: list[str]) -> dict[str, Any]:
    if not isinstance(image, str) or not image or any(c.isspace() for c in image):
        raise invalid_argument(
            "image", image, "a container image reference such as 'tensorflow/tensorflow:2.21.0'"
        )
    container: dict[str, Any] = {"name": "tensorflow", "image": image, "command": command}
    if args:
        container["args"] = args
    container["ports"] = [{"containerPort": TF_PORT, "name": "tfjob-port"}]
    return container


def _check_name(name: Any, longest_suffix: str) -> None:
    """Checks a resource name: derived names (``name + suffix``) must be DNS labels (RFC 1035)."""
    limit = 63 - len(longest_suffix)
    if not isinstance(name, str) or not _DNS_LABEL.fullmatch(name) or len(name) > limit:
        raise invalid_argument(
            "name",
            name,
            f"a DNS label of at most {limit} characters: lowercase letters, digits and '-', "
            "starting with a letter and ending with a letter or digit",
            note=f"Pods and services are named after it, e.g. '{name}{longest_suffix}', "
            "which must fit in 63.",
        )
