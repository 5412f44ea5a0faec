"""What each task of ``notebook_launcher`` runs: ``python -m tfdist.launch._notebook_task WORKDIR``.

A package-private entry point: only `tfdist.launch.notebook` starts it, and nothing imports it.
"""

from __future__ import annotations

import os
import pickle
import sys

import cloudpickle

from tfdist.cluster import parse_tf_config


def _run_task(workdir: str) -> None:
    with open(os.path.join(workdir, "fn.pkl"), "rb") as f:
        fn, args = pickle.load(f)
    result = fn(*args)
    # The launcher set TF_CONFIG; the chief (TF's rule) alone hands its result back.
    info = parse_tf_config(os.environ.get("TF_CONFIG"))
    if info is not None and info.is_chief:
        # Written whole, then renamed: the kernel never reads a half-written result.
        tmp = os.path.join(workdir, f"result.pkl.tmp-{os.getpid()}")
        with open(tmp, "wb") as f:
            cloudpickle.dump(result, f)
        os.replace(tmp, os.path.join(workdir, "result.pkl"))


if __name__ == "__main__":
    _run_task(sys.argv[1])
