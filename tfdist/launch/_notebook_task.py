"""What each task of ``notebook_launcher`` runs: ``python -m tfdist.launch._notebook_task WORKDIR``."""
from __future__ import annotations

import os
import pickle
import sys

import cloudpickle


def _run_task(workdir: str) -> None:
    import json

    with open(os.path.join(workdir, "fn.pkl"), "rb") as f:
        fn, args = pickle.load(f)
    result = fn(*args)
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    is_chief = task.get("type") == "chief" or (task.get("type") == "worker" and task.get("index") == 0
                                               and "chief" not in cluster)
    if is_chief:
        tmp = os.path.join(workdir, f"result.pkl.tmp-{os.getpid()}")
        with open(tmp, "wb") as f:
            cloudpickle.dump(result, f)
        os.replace(tmp, os.path.join(workdir, "result.pkl"))


if __name__ == "__main__":
    _run_task(sys.argv[1])
