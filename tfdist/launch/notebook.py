"""``notebook_launcher``: run a training function on a local cluster from Jupyter.

    def train():
        import tfdist
        strategy = tfdist.make_strategy("multi_worker")
        ...
        return history.history

    history = tfdist.launch.notebook_launcher(train, num_workers=2, max_restarts=1)

The function (and what it refers to) is pickled with cloudpickle, each task of
a loopback cluster runs it in a fresh process with TF_CONFIG set (the notebook
kernel itself needs no TensorFlow cluster), their output streams into the
cell prefixed by task, and the chief's return value comes back. The tasks are quiet as
``tfdist train`` is: TF_CPP_MIN_LOG_LEVEL=3 unless set, and without the lines TensorFlow's
import prints on every machine (`tfdist.quiet`). As under
``tfdist launch``, the tasks run in a private network namespace that has only
loopback, and no task outlives the kernel that started it.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import cloudpickle

from tfdist.config import check_positive_int
from tfdist.quiet import IMPORT_NOISE

_PREFIX = re.compile(r"^\[[\w:-]+\] ")  # "[worker:0] ", "[preload] "


class _WithoutImportNoise:
    """The tasks' prefixed lines, less those TensorFlow's import prints on every machine."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        kept = [
            line
            for line in text.splitlines(keepends=True)
            if not IMPORT_NOISE.match(_PREFIX.sub("", line, count=1))
        ]
        return self.stream.write("".join(kept))

    def flush(self) -> None:
        self.stream.flush()


def notebook_launcher(
    fn: Callable[..., Any],
    *args: Any,
    num_workers: int = 2,
    num_ps: int = 0,
    chief: bool = False,
    max_restarts: int = 0,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
    private_network: bool = True,
    pin: bool = False,
    preload: Sequence[str] | None = None,
) -> Any:
    """Runs ``fn(*args)`` in every task of a local cluster; returns the chief's result.

    Args:
        fn: A picklable (by cloudpickle) function; it runs once per task and
            should create its strategy first (``tfdist.make_strategy``).
        *args: Arguments for ``fn``.
        num_workers: Worker processes.
        num_ps: Parameter-server processes (then ``chief`` is needed too).
        chief: Add a chief task (the coordinator under parameter_server).
        max_restarts: Restarts after failures, as for ``tfdist launch``.
        timeout: Seconds after which every task is killed.
        env: Extra environment variables for the tasks.
        private_network: Run the tasks in a private network namespace that has
            only loopback (Linux, root; see ``tfdist.launch.local.launch``), so
            no other host can reach their gRPC ports. They reach nothing
            outside it either: pass False if ``fn`` needs the network.
        pin: Give each task its own CPUs and TF thread pools to match, when
            they fit, as ``tfdist launch`` does (``tfdist.launch.local.launch``).
            Off by default here: the fault-tolerance notebook's crash-and-resume
            run fails its step accounting with it on (not explained yet).
        preload: Modules (e.g. ``("tensorflow", "keras")``) that one Python imports
            before the tasks start; every task, restarts included, is forked from it
            (``tfdist launch --preload``): about 5 CPU-seconds less per task start.

    Returns:
        What ``fn`` returned on the chief (worker 0 without a chief).

    Raises:
        RuntimeError: If the job failed; the tasks' output says why.
    """
    from tfdist.launch.local import run
    from tfdist.launch.tasks import LaunchSpec

    check_positive_int("num_workers", num_workers)
    workdir = tempfile.mkdtemp(prefix="tfdist-notebook-")
    try:
        with open(os.path.join(workdir, "fn.pkl"), "wb") as f:
            cloudpickle.dump((fn, args), f)
        task_env = {**os.environ, **(env or {})}
        # TF's C++ INFO, WARNING and ERROR lines ("failed call to cuInit" without a GPU) are
        # not for a notebook's reader, unless the user set the level.
        task_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        task_env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), *sys.path])
        spec = LaunchSpec(
            command=[sys.executable, "-m", "tfdist.launch._notebook_task", workdir],
            workers=num_workers,
            ps=num_ps,
            chief=chief,
            max_restarts=max_restarts,
            timeout=timeout,
            env=task_env,
            output=_WithoutImportNoise(sys.stdout),
            private_network=private_network,
            pin=pin,
            preload=preload,
        )
        code = run(spec)
        if code != 0:
            raise RuntimeError(
                f"The notebook_launcher job failed with code {code}; see the tasks' output above."
            )
        with open(os.path.join(workdir, "result.pkl"), "rb") as f:
            return pickle.load(f)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
