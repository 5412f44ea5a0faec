"""The Ray side of tests/ray: one driver process, one local Ray cluster, scenarios on request.

    unshare -n sh -c 'ip link set lo up && exec python -m tests.ray.driver NUM_CPUS'

test_ray.py starts it in a private network namespace that holds only loopback,
so Ray's ports, TF's gRPC ports and every packet of the tests stay inside it
(Ray writes the node's address into TF_CONFIG; inside the namespace that is
127.0.0.1). It reads one JSON request per line, ``{"id": ID, "scenario": NAME,
"args": [...]}``, runs each in its own thread as soon as it arrives, and answers
each with one line ``RESULT {"id": ID, "ok": ...}`` (or ``"error"``) when it ends.

Why threads: most of a scenario's wall time is Ray and TF starting up
(placement groups, worker actors importing TensorFlow, MWMS connecting), not
computing, so scenarios run side by side finish far sooner than one after
another. Ray queues the worker groups that do not fit in the cluster's CPUs and
starts them as others end; the scenarios share nothing but the cluster.
"""

import concurrent.futures
import json
import os
import sys
import tempfile
import threading
import time
import traceback

import numpy as np
import ray

from tests.ray import jobs


def main_group(out_dir):
    """The fault scenario, and the jobs that share a worker group with its reference.

    Two groups run side by side: ``jobs.several`` (the uninterrupted reference, the Trainer on
    digits, the Trainer on Ray Data) and the faulty run, whose rank 1 dies after global batch 21
    and which Ray restarts once. Op determinism makes the reference's weights independent of what
    else runs, and the two groups' start-up waits overlap.
    """
    import ray.data
    from sklearn.datasets import load_digits

    from tfdist.launch.ray.engine import ray_fit

    storage = tempfile.mkdtemp(prefix="ray-results-")
    reference_dir, faulty_dir = os.path.join(out_dir, "reference"), os.path.join(out_dir, "faulty")
    os.makedirs(reference_dir), os.makedirs(faulty_dir)
    data = load_digits()
    digits = ray.data.from_items(
        [{"x": (x / 16.0).astype("float32"), "y": int(y)} for x, y in zip(data.data, data.target)]
    )
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(
            ray_fit,
            jobs.several,
            reference_dir,
            6,
            3,
            num_workers=2,
            datasets={"train": digits},
            storage_path=storage,
            name="several",
        )
        start = time.time()
        faulty = ray_fit(
            jobs.train_with_backups,
            faulty_dir,
            21,
            num_workers=2,
            max_failures=1,
            storage_path=storage,
            name="faulty",
        )
        faulty_seconds = time.time() - start
        several = pending.result()
    chief = faulty.outputs[0]
    reference = several.outputs[0]["reference"]
    killed_at = float(open(os.path.join(faulty_dir, "killed_at")).read())
    same = all(
        all(np.array_equal(a, b) for a, b in zip(out["weights"], reference["weights"]))
        for out in faulty.outputs
    )
    checkpoint = faulty.result.checkpoint
    with checkpoint.as_directory() as d:
        final_state = json.load(open(os.path.join(d, "state.json")))
    fault = {
        "same_weights_as_uninterrupted": same,
        "attempts": [o["attempt"] for o in faulty.outputs],
        "iterations": [o["iterations"] for o in faulty.outputs],
        "restored": chief["restored"],
        "kill_to_resume_s": chief["restored_at"] - killed_at,
        "seconds": faulty_seconds,
        "metrics": faulty.result.metrics,
        "checkpoint_state": final_state,
        "error": repr(faulty.result.error),
    }
    return {
        "fault": fault,
        "training": [o["training"] for o in several.outputs],
        "ray_data": [o["ray_data"] for o in several.outputs],
    }


def quickstart():
    import ray.data
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    rng = np.random.default_rng(0)
    xs = rng.uniform(size=256).astype("float32")
    dataset = ray.data.from_items([{"x": float(x), "y": float(2 * x + 1)} for x in xs])
    trainer = TensorflowTrainer(
        jobs.ray_quickstart,
        train_loop_config={"batch_size": 16, "epochs": 2},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=tempfile.mkdtemp(prefix="ray-results-")),
        datasets={"train": dataset},
    )
    result = trainer.fit()
    return {
        "metrics": result.metrics,
        "has_checkpoint": result.checkpoint is not None,
        "error": repr(result.error),
    }


def too_many_workers():
    from tfdist.launch.ray.engine import ray_launcher

    start = time.time()
    try:
        ray_launcher(jobs.train_digits, 1, num_workers=64)
    except ValueError as e:
        return {"error": str(e), "seconds": time.time() - start}
    return {"error": None}


def cli(args):
    import subprocess

    # As a user's shell has it: this driver's own RAY_DEDUP_LOGS=1 would keep Ray's coloured
    # "[repeated 2x across cluster]" notes in the CLI's log (tfdist only sets a default).
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}
    env.pop("RAY_DEDUP_LOGS", None)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "tfdist", "train", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=540,
        )
    except subprocess.TimeoutExpired as e:  # what it printed says where it was
        output = e.output.decode() if isinstance(e.output, bytes) else e.output or ""
        return {"returncode": "timed out after 540 s", "output": output[-5000:]}
    return {"returncode": proc.returncode, "output": proc.stdout[-5000:]}


def main():
    for attempt in (1, 2):
        try:
            ray.init(num_cpus=int(sys.argv[1]), include_dashboard=False, log_to_driver=True)
            break
        except Exception:  # Ray gives its raylet 30 s to register; a busy machine can miss that
            if attempt == 2:
                raise
            traceback.print_exc()
            ray.shutdown()
    print("READY", flush=True)
    write = threading.Lock()  # one RESULT line at a time

    def run(request):
        try:
            answer = {"ok": globals()[request["scenario"]](*request.get("args", []))}
        except Exception:  # the test shows it
            answer = {"error": traceback.format_exc()}
        line = "RESULT " + json.dumps({"id": request["id"], **answer}, default=repr) + "\n"
        with write:
            sys.stdout.write(line)
            sys.stdout.flush()

    # Leaving the with-block (stdin closed) waits for every scenario still running.
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        for line in sys.stdin:
            pool.submit(run, json.loads(line))
    ray.shutdown()


if __name__ == "__main__":
    main()
