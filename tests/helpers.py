"""Helpers for tests that start real processes."""

import os
import re
import signal
import subprocess
import sys

import keras
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_tfdist(*args, env=None, timeout=300):
    """Runs ``python -m tfdist ARGS`` and returns the CompletedProcess (text, merged output).

    On timeout the launcher gets SIGTERM first, so that it stops the task
    processes it started (they run in their own sessions) before it goes.
    """
    full_env = dict(os.environ)
    full_env.pop("TF_CONFIG", None)
    full_env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    command = [sys.executable, "-m", "tfdist", *args]
    with subprocess.Popen(
        command, cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                out, _ = proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            raise subprocess.TimeoutExpired(command, timeout, output=out) from None
    return subprocess.CompletedProcess(command, proc.returncode, out, None)


class Crash(keras.callbacks.Callback):
    """Raises after a given global batch, like a crash in the middle of training."""

    def __init__(self, after):
        super().__init__()
        self.after, self.seen = after, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen - 1 == self.after:
            raise RuntimeError("simulated crash")


#: What the multi-process tests pass to ``tfdist launch``: every task (restarts included) is
#: forked from one Python that imported TensorFlow and Keras once, instead of importing them
#: itself (about 6 CPU-seconds a process on 2 cores). A few launch tests keep the default start.
PRELOAD_MODULES = ("tensorflow", "keras")
PRELOAD = "--preload=" + ",".join(PRELOAD_MODULES)

#: The multi-worker backup job of the fault tests (``tests/jobs/backup_job.py``).
BACKUP_JOB = os.path.join(REPO, "tests", "jobs", "backup_job.py")


def launch_backup_job(out, backup, *extra, restarts, timeout, preload=True):
    """``tfdist launch --workers=2`` of the backup job on MWMS; each worker's weights in ``out``.

    ``preload=False``: each task starts afresh, as by default.
    """
    return run_tfdist(
        "launch",
        "--workers=2",
        f"--max_restarts={restarts}",
        *([PRELOAD] if preload else []),
        "--",
        sys.executable,
        BACKUP_JOB,
        "multi_worker",
        str(out),
        str(backup),
        *extra,
        timeout=timeout,
    )


_FATAL = re.compile(r"\bF\d{4} |Check failed|terminate called|Fatal Python error|Aborted|restart")


def launch_report(proc, tail=3000):
    """What a failed launch printed: its fatal-looking and restart lines, then its last lines.

    A worker that aborts says why early in the log, and the tail alone often holds only the
    other worker's traceback that followed.
    """
    lines = [line for line in proc.stdout.splitlines() if _FATAL.search(line)]
    return "\n".join(lines[-40:]) + "\n...\n" + proc.stdout[-tail:]


def npz_weights(path):
    """The arrays a job saved with ``np.savez(path, *weights)``, in order."""
    with np.load(path) as f:
        return [f[f"arr_{i}"] for i in range(len(f.files))]


def train_config_of(*flags):
    """The ``TrainConfig`` of ``tfdist train FLAGS``, parsed in-process as the CLI parses it."""
    from tfdist import cli
    from tfdist.cli import train_command

    cli.FLAGS.unparse_flags()
    try:
        cli.parse_flags(["tfdist", "train", *flags])
        return train_command.train_config()
    finally:
        cli.FLAGS.unparse_flags()


def run_cli_in_process(args, capsys):
    """Runs ``tfdist ARGS`` in-process as ``app.run`` would; returns (exit code, stderr)."""
    from tfdist import cli

    cli.FLAGS.unparse_flags()
    capsys.readouterr()
    try:
        code = cli.main(cli.parse_flags(["tfdist", *args]))
    except SystemExit as e:
        code = e.code
    finally:
        cli.FLAGS.unparse_flags()
    return code, capsys.readouterr().err
