"""TensorFlow without its start-up noise: for ``tfdist train``, notebooks and scripts.

``import tensorflow`` writes, from C++ and before TF_CPP_MIN_LOG_LEVEL applies, "WARNING:
All log messages before absl::InitializeLog() ...", oneDNN's "custom operations are on" and,
on a machine without a GPU, "Could not find cuda drivers", twice (two libraries). None is
actionable on a first run. When the user has not asked for TF's INFO lines, ``tfdist train``
imports TensorFlow with the process's stderr captured and writes back every line but those;
`quiet_tensorflow` (``tfdist.quiet_tensorflow()``) does the same in a notebook or a
script, and ``notebook_launcher`` drops those lines from its tasks' output.

A leaf module: no TensorFlow at import, nothing from tfdist.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator

#: Lines TensorFlow's import prints on every run (its C++ logging, before absl starts).
IMPORT_NOISE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
    r"|I\d{4} [\d:.]+\s+\d+ (port\.cc|cudart_stub\.cc):\d+\] "
)


#: Loggers whose INFO lines are not for users: TF's (one line per all-reduce it sets up),
#: absl's, and matplotlib's ("generated new fontManager" when Keras's import builds its cache).
NOISY_LOGGERS = ("absl", "tensorflow", "matplotlib")


def quiet_loggers() -> None:
    """Keeps only WARNING and above of `NOISY_LOGGERS` (the CLI, and each Ray worker)."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


@contextlib.contextmanager
def stderr_without(noise: re.Pattern[str]) -> Iterator[None]:
    """Captures file descriptor 2 (C++ and Python writes) and writes back what ``noise`` spares."""
    sys.stderr.flush()
    # The process's fd 2, where C++ writes: in a Jupyter kernel sys.stderr is a stream that
    # forwards fd 2 to the cell, and its own fileno() is another descriptor.
    fd = 2
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not noise.match(line)))
            sys.stderr.flush()


def import_tensorflow() -> None:
    """Imports TensorFlow; quietly unless TF_CPP_MIN_LOG_LEVEL asks for its INFO lines (0)."""
    if "tensorflow" in sys.modules or os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") == "0":
        import tensorflow  # noqa: F401

        return
    with stderr_without(IMPORT_NOISE):
        import tensorflow  # noqa: F401


def quiet_tensorflow() -> None:
    """Quiets TensorFlow for a notebook or a script, as ``tfdist train`` does; call it first.

    Sets ``TF_CPP_MIN_LOG_LEVEL=3`` unless you set it (TF's C++ INFO, WARNING and ERROR lines,
    e.g. "failed call to cuInit" without a GPU; real failures still raise in Python), imports
    TensorFlow without the lines its import prints on every machine (`IMPORT_NOISE`),
    and keeps only the warnings of TF's, absl's and matplotlib's Python loggers
    (`NOISY_LOGGERS`; TF logs one INFO line per all-reduce it sets up). Your own
    ``TF_CPP_MIN_LOG_LEVEL=0`` keeps everything TF prints.

    Example:
        ```python
        import tfdist

        tfdist.quiet_tensorflow()  # before anything imports TensorFlow
        strategy = tfdist.make_strategy("mirrored", num_devices=2)
        ```
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import_tensorflow()
    quiet_loggers()  # after the import: TF's import sets its logger's level
