"""The ``tfdist`` command line (also ``python -m tfdist``).

tfdist train --strategy=mirrored --num_devices=2 --model=cnn --dataset=digits --epochs=8
tfdist launch --workers=2 -- tfdist train --strategy=multi_worker
tfdist train --engine=ray --num_workers=2 --epochs=5  # Ray Train (RAY_ADDRESS, else a local one)
tfdist launch --nnodes=2 --node_rank=0 --hosts=h1:2222,h2:2222 --allow_external -- tfdist train
tfdist manifest slurm --nnodes=2 --workers=4 --output=job.sbatch -- tfdist train
tfdist manifest slurm --ntasks=2 --max_restarts=3 -- tfdist train --backup_dir=DIR
tfdist manifest kubernetes --workers=2 --image=IMAGE --output=job.yaml -- tfdist train
tfdist bench --output=bench_results/bench.json

(the launched ``tfdist train`` takes ``--strategy=multi_worker``.) One job per module:

* ``flag_definitions.py``: every flag, grouped by the command that reads it;
* ``usage.py``: the commands, ``parse_flags`` and the one-line ``tfdist COMMAND: error:``;
* ``train_command.py``, ``launch_command.py``, ``manifest_command.py``,
  ``bench_command.py``: what each command does with the flags;
* here: ``main`` (dispatch, logging) and ``run``, the console script's entry point.

Loading the CLI imports no TensorFlow: ``tfdist train`` and ``tfdist bench`` import it
when they run, ``tfdist launch`` and ``tfdist manifest`` never.

* ``help``: ``tfdist --help``, ``tfdist COMMAND --help`` and ``--version``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from absl import app

from tfdist import quiet
from tfdist.cli import bench_command, launch_command, manifest_command, train_command
from tfdist.cli.flag_definitions import FLAGS
from tfdist.cli.usage import (
    COMMANDS,
    error_line,
    is_invalid_argument,
    parse_flags,
    refuse_flags_not_read,
)
from tfdist.config import invalid_argument

__all__ = ["FLAGS", "COMMANDS", "main", "parse_flags", "run"]

# TF's C++ log level when the user has not chosen one: 3 hides its INFO, WARNING and ERROR
# lines. On a first run those are all noise ("failed call to cuInit" without a GPU, "Local
# rendezvous is aborting with status: CANCELLED" at the end of an epoch, "GeneratorDatasetOp
# ... will not be optimized"); real failures still reach Python as exceptions.
# TF_CPP_MIN_LOG_LEVEL=0 shows everything.
QUIET_TF_CPP_MIN_LOG_LEVEL = "3"
_RUN = {
    "train": train_command.run,
    "launch": launch_command.run,
    "bench": bench_command.run,
    "manifest": manifest_command.run,
}


def main(argv: Sequence[str]) -> int:
    """Dispatches ``tfdist COMMAND [flags] [-- args]`` (flags already parsed).

    Returns:
        The exit code: 2, after one ``tfdist COMMAND: error: Invalid value for
        argument ...`` line on stderr, for a bad argument.
    """
    if len(argv) < 2 or argv[1] not in COMMANDS:
        received = argv[1] if len(argv) > 1 else None
        error = invalid_argument(
            "command", received, COMMANDS, note="Run `tfdist --help` for what each one does."
        )
        print(error_line("", error), file=sys.stderr)
        return 2
    # Before anything imports TensorFlow, which reads it once. Launched tasks inherit it.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", QUIET_TF_CPP_MIN_LOG_LEVEL)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    quiet.quiet_loggers()
    try:
        refuse_flags_not_read(argv[1])
        return _RUN[argv[1]](argv[2:])
    except ValueError as e:
        if is_invalid_argument(e):
            print(error_line(argv[1], e), file=sys.stderr)
            return 2
        raise


def run() -> None:
    """Console-script entry point."""
    app.run(main, flags_parser=parse_flags)
