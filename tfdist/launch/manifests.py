"""Job files for clusters that start the processes themselves: Slurm and Kubernetes.

This is what ``tfdist manifest`` runs::

    tfdist manifest slurm --nnodes=2 --workers=4 --output=job.sbatch -- tfdist train --strategy=multi_worker
    tfdist manifest kubernetes --workers=2 --ps=1 --chief --image=IMAGE --output=job.yaml -- python train.py
    tfdist manifest kubernetes --kind=indexed-job --workers=4 --image=IMAGE -- python train.py

Nothing here talks to a cluster or imports TensorFlow; each function returns
the text (or dicts) to write. YAML is written by a small block-style emitter
whose scalars are JSON literals, which YAML reads as they are, so no YAML
library is needed.

How each task learns its place in the cluster:

* Slurm: ``srun`` sets SLURM_* variables and :func:`tfdist.cluster.from_slurm`
  turns them into a cluster (what ``make_strategy`` reads): task SLURM_PROCID
  is worker SLURM_PROCID, or takes its role by rank from TFDIST_SLURM_ROLES
  (chief, then ps, then workers), and the k-th task on a node listens on port
  ``slurm_port_base(SLURM_JOB_ID) + k``.
* Kubernetes ``tfjob``: the Kubeflow training operator sets TF_CONFIG itself.
* Kubernetes ``indexed-job``: a one-line shell prefix exports TF_CONFIG built
  from JOB_COMPLETION_INDEX, with the headless Service's DNS names
  ``NAME-INDEX.NAME:2222`` as the cluster, then ``exec``\\ s the command.
"""
from __future__ import annotations

import json
import re
import shlex
from typing import Any, Literal, Mapping, Sequence

from tfdist.cluster import SLURM_PORT_BASE, SLURM_PORT_BLOCKS, SLURM_PORTS_PER_JOB
from tfdist.config import PREEMPTED_EXIT_CODE, check_positive_int, invalid_argument

MANIFEST_KINDS = ("kubernetes", "slurm")
KUBERNETES_KINDS = ("indexed-job", "tfjob")
TF_PORT = 2222  # The port Kubeflow's TFJob gives every replica ("tfjob-port").
JOB_LABEL = "tfdist-job"  # Pod label the indexed Job's headless Service selects.
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9_./-]*")  # Strings YAML reads as strings without quotes...
_YAML_WORDS = {"y", "n", "yes", "no", "true", "false", "on", "off", "null"}  # ...except these words.
_SLURM_TIME = re.compile(r"[0-9]+(:[0-9]{1,2}){0,2}|[0-9]+-[0-9]{1,2}(:[0-9]{1,2}){0,2}|(?i:unlimited|infinite)")


def slurm_script(command: Sequence[str], *, nnodes: int = 1, workers: int | None = None, ntasks: int | None = None,
                 ps: int = 0, chief: bool = False, partition: str | None = None, time: str | None = None,
                 job_name: str = "tfdist", max_restarts: int = 0) -> str:
    """Returns an sbatch script that runs ``command`` once per Slurm task.

    ``srun`` starts the tasks; each builds its cluster from the SLURM_*
    variables (:func:`tfdist.cluster.from_slurm`). Without ``chief``/``ps``
    every task is a MultiWorkerMirrored worker (rank 0 is the chief). With
    them, the script exports ``TFDIST_SLURM_ROLES`` and ranks take roles in
    order: the chief, then the ps, then the workers; the job ends when the
    chief does, with its exit code (ps and workers serve until then).

    With ``max_restarts``, the job is requeued when its tasks exit with code
    75 (they saved a backup after SIGTERM, e.g. ``scancel --signal=TERM JOB``
    or ``sbatch --signal=TERM@120``), at most that many times; run
    ``tfdist train --backup_dir=DIR`` so that the next run resumes there.

    Args:
        command: The program and its arguments, run by ``srun`` on every task.
        nnodes: The number of nodes (``#SBATCH --nodes``).
        workers: Workers per node; the default without ``ntasks`` is 2.
        ntasks: Total tasks (chief, ps and workers), a multiple of ``nnodes``;
            instead of ``workers``.
        ps: Parameter-server tasks (needs ``chief``).
        chief: Whether rank 0 is a chief (the parameter-server coordinator).
        partition: The Slurm partition, or None for the cluster's default.
        time: The job's time limit in Slurm's syntax (``--time``), e.g.
            ``"30"``, ``"01:00:00"`` or ``"1-12:00:00"``; None for the default.
        job_name: The job's name (``#SBATCH --job-name``).
        max_restarts: Requeues after a preemption (exit code 75); 0 for none.

    Returns:
        The script's text; submit it with ``sbatch FILE``.

    Raises:
        ValueError: On a bad argument, or tasks that do not divide into the roles.
    """
    command = _check_command(command)
    check_positive_int("nnodes", nnodes)
    if isinstance(ps, bool) or not isinstance(ps, int) or ps < 0:
        raise invalid_argument("ps", ps, "a non-negative integer")
    if ps and not chief:
        raise invalid_argument("ps", ps, "0 without a chief",
                               note="Parameter-server training needs a chief to coordinate it; add --chief.")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise invalid_argument("max_restarts", max_restarts, "a non-negative integer")
    others = ps + int(bool(chief))
    if ntasks is None:
        check_positive_int("workers", 2 if workers is None else workers)
        ntasks = nnodes * (2 if workers is None else workers) + others
    elif workers is not None:
        raise invalid_argument("workers", workers, "None with ntasks",
                               note="Give the total --ntasks, or --workers per node, not both.")
    check_positive_int("ntasks", ntasks)
    if ntasks < others + 1:
        raise invalid_argument("ntasks", ntasks, f"at least {others + 1}",
                               note=f"The roles need {int(bool(chief))} chief, {ps} ps and at least one worker.")
    if ntasks % nnodes:
        raise invalid_argument("ntasks", ntasks, f"a multiple of nnodes={nnodes}",
                               note="Every node runs the same number of tasks (--ntasks-per-node).")
    per_node = ntasks // nnodes
    if per_node > SLURM_PORTS_PER_JOB:
        raise invalid_argument("ntasks", ntasks, f"at most {SLURM_PORTS_PER_JOB} tasks per node",
                               note="tfdist gives each job a block of that many ports per node.")
    _check_word("job_name", job_name)
    directives = [f"--job-name={job_name}", f"--nodes={nnodes}", f"--ntasks-per-node={per_node}"]
    if partition is not None:
        directives.append(f"--partition={_check_word('partition', partition)}")
    if time is not None:
        if not isinstance(time, str) or not _SLURM_TIME.fullmatch(time):
            raise invalid_argument("time", time, "a Slurm time such as '30', '01:00:00' or '1-12:00:00'")
        directives.append(f"--time={time}")
    if max_restarts:
        directives += ["--requeue", "--open-mode=append"]  # Keep the first run's output when requeued.
    roles = f"chief:1,ps:{ps},worker:{ntasks - others}" if chief else ""
    # A dying MWMS task must stop the others (they would wait in a collective), but a preempted
    # non-chief exits 75 while the chief may still commit the backup: then allow it 60 s.
    # With a chief (PS) the chief alone decides: ps and workers never exit on their own.
    bad_exit = ["--kill-on-bad-exit=0"] if chief else ["--wait=60"] if max_restarts else ["--kill-on-bad-exit=1"]
    srun = ["srun", f"--nodes={nnodes}", f"--ntasks-per-node={per_node}", *bad_exit]
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {d}" for d in directives),
        "#",
        "# Written by `tfdist manifest slurm`; submit with `sbatch FILE`.",
        f"# {nnodes} node(s) x {per_node} task(s). Each task builds the cluster from the SLURM_* variables",
        "# (tfdist.cluster.from_slurm, read by tfdist.make_strategy): one node talks over 127.0.0.1;",
        f"# the k-th task on a node listens on port {SLURM_PORT_BASE} + {SLURM_PORTS_PER_JOB} * (job id % "
        f"{SLURM_PORT_BLOCKS}) + k.",
        f"# Roles by rank: {roles}." if roles else "# Every task is a worker; rank 0 is the chief.",
        "set -uo pipefail",
        "unset TF_CONFIG  # One exported by the submitting shell would override the Slurm cluster.",
    ]
    if roles:
        lines += [
            f"export TFDIST_SLURM_ROLES={roles}",
            "# The chief (rank 0, on this node) leaves its exit code here; then the ps and workers are stopped.",
            'export TFDIST_CHIEF_RC="${TMPDIR:-/tmp}/tfdist-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}.chief-rc"',
            'rm -f "$TFDIST_CHIEF_RC"',
            shlex.join([*srun, "bash", "-c", _CHIEF_RC_WRAPPER, "tfdist-task", *command]) + " &",
            "step=$!",
            'while kill -0 "$step" 2>/dev/null && [ ! -s "$TFDIST_CHIEF_RC" ]; do sleep 1; done',
            'if [ -s "$TFDIST_CHIEF_RC" ]; then',
            '  rc=$(cat "$TFDIST_CHIEF_RC"); rm -f "$TFDIST_CHIEF_RC"',
            '  kill -TERM "$step" 2>/dev/null; wait "$step"  # srun passes SIGTERM on to the ps and workers.',
            "else",
            '  wait "$step"; rc=$?',
            "fi",
        ]
    else:
        lines += [shlex.join([*srun, *command]), "rc=$?"]
    if max_restarts:
        lines += [
            f'if [ "$rc" -eq {PREEMPTED_EXIT_CODE} ] && [ "${{SLURM_RESTART_COUNT:-0}}" -lt {max_restarts} ]; then',
            f'  echo "tfdist: tasks saved a backup after SIGTERM (exit {PREEMPTED_EXIT_CODE}); requeueing job '
            f'$SLURM_JOB_ID (restart $(( ${{SLURM_RESTART_COUNT:-0}} + 1 )) of {max_restarts})" >&2',
            '  scontrol requeue "$SLURM_JOB_ID"  # Ends this run; the job waits in the queue for its next one.',
            "fi",
        ]
    lines += ['exit "$rc"', ""]
    return "\n".join(lines)


# Runs the task's command; rank 0 (the chief) also writes its exit code where the batch script waits for it.
_CHIEF_RC_WRAPPER = ('"$@"; rc=$?; if [ "$SLURM_PROCID" = 0 ]; then echo "$rc" > "$TFDIST_CHIEF_RC.tmp" '
                     '&& mv "$TFDIST_CHIEF_RC.tmp" "$TFDIST_CHIEF_RC"; fi; exit "$rc"')


def tfjob(command: Sequence[str], *, workers: int, image: str, ps: int = 0, chief: bool = False,
          name: str = "tfdist") -> dict[str, Any]:
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
        The manifest as a dict (see :func:`to_yaml`).

    Raises:
        ValueError: On a bad argument.
    """
    command = _check_command(command)
    check_positive_int("workers", workers)
    if isinstance(ps, bool) or not isinstance(ps, int) or ps < 0:
        raise invalid_argument("ps", ps, "a non-negative integer")
    counts = {"Chief": int(bool(chief)), "Worker": workers, "PS": ps}
    _check_name(name, max((f"-{t.lower()}-{n - 1}" for t, n in counts.items() if n), key=len))
    container = _container(image, command[:1], command[1:])
    replicas = {t: {"replicas": n, "restartPolicy": "OnFailure", "template": {"spec": {"containers": [container]}}}
                for t, n in counts.items() if n}
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": name},
            "spec": {"tfReplicaSpecs": replicas}}


def indexed_job(command: Sequence[str], *, workers: int, image: str, name: str = "tfdist") -> list[dict[str, Any]]:
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
        ``[service, job]`` as dicts (see :func:`to_yaml`).

    Raises:
        ValueError: On a bad argument.
    """
    command = _check_command(command)
    check_positive_int("workers", workers)
    _check_name(name, f"-{workers - 1}")
    cluster = {"worker": [f"{name}-{i}.{name}:{TF_PORT}" for i in range(workers)]}
    prefix = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})[:-3]  # Drop '0}}'.
    script = f"export TF_CONFIG='{prefix}'\"$JOB_COMPLETION_INDEX\"'}}}}' && exec \"$@\""
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {JOB_LABEL: name},
                 "ports": [{"name": "tfjob-port", "port": TF_PORT, "targetPort": TF_PORT}]},
    }
    job = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed", "completions": workers, "parallelism": workers, "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {JOB_LABEL: name}},
                "spec": {"subdomain": name, "restartPolicy": "Never",
                         "containers": [_container(image, ["/bin/sh", "-c", script, "tfdist-task"], command)]},
            },
        },
    }
    return [service, job]


def kubernetes_manifest(command: Sequence[str], *, workers: int, image: str, ps: int = 0, chief: bool = False,
                        name: str = "tfdist", kind: Literal["tfjob", "indexed-job"] = "tfjob") -> str:
    """Returns the YAML of :func:`tfjob` or :func:`indexed_job`.

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
        return to_yaml([tfjob(command, workers=workers, image=image, ps=ps, chief=chief, name=name)])
    for arg, value, default in (("ps", ps, 0), ("chief", chief, False)):
        if value != default:
            raise invalid_argument(
                arg, value, f"{default!r} with kind='indexed-job'",
                note="An Indexed Job runs an all-worker (MultiWorkerMirrored) cluster and completes only when "
                     "every pod exits, which parameter servers never do; use kind='tfjob'.")
    return to_yaml(indexed_job(command, workers=workers, image=image, name=name))


def to_yaml(documents: Sequence[Mapping[str, Any]]) -> str:
    """Writes dicts as a multi-document YAML stream (block style, JSON scalars)."""
    return "---\n".join("\n".join(_yaml_lines(doc, 0)) + "\n" for doc in documents)


def _yaml_lines(value: Any, indent: int):
    pad = "  " * indent
    if isinstance(value, Mapping):
        for key, item in value.items():
            key = _scalar(str(key))
            if isinstance(item, (Mapping, list)) and item:
                yield f"{pad}{key}:"
                yield from _yaml_lines(item, indent + 1)
            else:
                yield f"{pad}{key}: {_scalar(item)}"
    else:
        for item in value:
            if isinstance(item, (Mapping, list)) and item:
                lines = list(_yaml_lines(item, indent + 1))
                yield pad + "- " + lines[0][len(pad) + 2:]
                yield from lines[1:]
            else:
                yield f"{pad}- {_scalar(item)}"


def _scalar(value: Any) -> str:
    if isinstance(value, str):
        if _PLAIN.fullmatch(value) and value.lower() not in _YAML_WORDS:
            return value
        return json.dumps(value).replace("\x7f", "\\u007f")  # A JSON string is a YAML double-quoted scalar.
    if value is None or isinstance(value, (bool, int, float)):
        return json.dumps(value)
    if isinstance(value, (Mapping, list)) and not value:
        return "{}" if isinstance(value, Mapping) else "[]"
    raise TypeError(f"Cannot write {type(value).__name__} as YAML: {value!r}")


def _container(image: str, command: list[str], args: list[str]) -> dict[str, Any]:
    if not isinstance(image, str) or not image or any(c.isspace() for c in image):
        raise invalid_argument("image", image, "a container image reference such as 'tensorflow/tensorflow:2.21.0'")
    container: dict[str, Any] = {"name": "tensorflow", "image": image, "command": command}
    if args:
        container["args"] = args
    container["ports"] = [{"containerPort": TF_PORT, "name": "tfjob-port"}]
    return container


def _check_command(command: Any) -> list[str]:
    if isinstance(command, (str, bytes)) or not command or not all(isinstance(c, str) for c in command):
        raise invalid_argument("command", command, "a non-empty list of strings, e.g. ['python', 'train.py']")
    return list(command)


def _check_word(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        raise invalid_argument(name, value, "a non-empty string without whitespace")
    return value


def _check_name(name: Any, longest_suffix: str) -> None:
    """Checks a resource name: derived names (``name + suffix``) must be DNS labels (RFC 1035)."""
    limit = 63 - len(longest_suffix)
    if not isinstance(name, str) or not _DNS_LABEL.fullmatch(name) or len(name) > limit:
        raise invalid_argument(
            "name", name, f"a DNS label of at most {limit} characters: lowercase letters, digits and '-', "
                          "starting with a letter and ending with a letter or digit",
            note=f"Pods and services are named after it, e.g. '{name}{longest_suffix}', which must fit in 63.")
