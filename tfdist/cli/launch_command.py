"""``tfdist launch [flags] -- COMMAND``: a cluster of processes (`tfdist.launch.local`)."""

from __future__ import annotations

from collections.abc import Sequence

from tfdist.cli.flag_definitions import FLAGS
from tfdist.config import invalid_argument


def run(args: Sequence[str]) -> int:
    """Runs ``tfdist launch`` with ``args``, the command after ``--``.

    Returns:
        The exit code of the launched job.
    """
    if not args:
        raise invalid_argument(
            "command",
            [],
            "a command after --",
            note="tfdist launch needs a command after --, "
            "e.g. tfdist launch --workers=2 -- tfdist train.",
        )
    from tfdist.launch.local import launch

    return launch(
        list(args),
        workers=FLAGS.workers,
        ps=FLAGS.ps,
        chief=FLAGS.chief,
        evaluator=FLAGS.evaluator,
        host=FLAGS.host,
        allow_external=FLAGS.allow_external,
        timeout=FLAGS.timeout,
        max_restarts=FLAGS.max_restarts,
        nnodes=FLAGS.nnodes,
        node_rank=FLAGS.node_rank,
        hosts=FLAGS.hosts,
        private_network=FLAGS.private_network,
        pin=FLAGS.pin,
        preload=FLAGS.preload,
    )
