"""``tfdist manifest slurm|kubernetes [flags] -- COMMAND``: writes a job for a cluster manager."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tfdist.cli.flag_definitions import FLAGS
from tfdist.config import invalid_argument

# Flags a manifest kind does not use, refused when given rather than silently ignored.
UNUSED_FLAGS = {
    "slurm": ("evaluator", "image", "kind", "name", "hosts", "node_rank"),
    "kubernetes": (
        "nnodes",
        "min_nodes",
        "evaluator",
        "partition",
        "time",
        "job_name",
        "hosts",
        "node_rank",
        "ntasks",
        "max_restarts",
        "pin",
    ),
}


def run(args: Sequence[str]) -> int:
    """Writes the manifest ``args`` asks for (``[KIND, command after -- ...]``).

    Returns:
        The exit code, 0.
    """
    from tfdist.launch import manifests

    kind = args[0] if args else None
    if kind not in manifests.MANIFEST_KINDS:
        raise invalid_argument(
            "manifest",
            kind,
            manifests.MANIFEST_KINDS,
            note="Write it right after `manifest`, e.g. tfdist manifest slurm --nnodes=2 -- CMD.",
        )
    command = list(args[1:])
    if not command:
        raise invalid_argument(
            "command",
            [],
            "a command after --",
            note=f"tfdist manifest {kind} needs a command after --, e.g. tfdist manifest {kind} "
            "--workers=2 -- tfdist train --strategy=multi_worker.",
        )
    _refuse_unused_flags(kind)
    text, submit = _manifest_text(kind, command)
    if not FLAGS["output"].present:
        sys.stdout.write(text)
        return 0
    with open(FLAGS.output, "w") as f:
        f.write(text)
    print(f"Wrote {FLAGS.output}; submit it with: {submit} {FLAGS.output}")
    return 0


def _refuse_unused_flags(kind: str) -> None:
    """Raises on the first flag given that manifests of ``kind`` do not read."""
    for name in UNUSED_FLAGS[kind]:
        if FLAGS[name].present:
            raise invalid_argument(
                name, FLAGS[name].value, f"no --{name} for `tfdist manifest {kind}`"
            )


def _manifest_text(kind: str, command: list[str]) -> tuple[str, str]:
    """The manifest of ``kind`` from the flags, and the command that submits it."""
    from tfdist.launch import manifests

    if kind == "slurm":
        text = manifests.slurm_script(
            command,
            nnodes=FLAGS.nnodes,
            workers=FLAGS.workers if FLAGS["workers"].present else None,
            ntasks=FLAGS.ntasks,
            ps=FLAGS.ps,
            chief=FLAGS.chief,
            partition=FLAGS.partition,
            time=FLAGS.time,
            job_name=FLAGS.job_name,
            max_restarts=FLAGS.max_restarts,
            min_nodes=FLAGS.min_nodes,
            pin=FLAGS.pin,
        )
        return text, "sbatch"
    text = manifests.kubernetes_manifest(
        command,
        workers=FLAGS.workers,
        image=FLAGS.image,
        ps=FLAGS.ps,
        chief=FLAGS.chief,
        name=FLAGS.name,
        kind=FLAGS.kind,
    )
    return text, "kubectl apply -f"
