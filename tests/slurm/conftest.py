"""One real single-node Slurm cluster (munged, slurmctld, slurmd) for all Slurm tests of a session.

tests/slurm/start.sh installs slurm-wlm and munge when they are missing, and
runs the daemons in a network namespace of their own whose only interface is
loopback; jobs inherit it. The tests skip only when that is impossible here
(not root, or no apt-get and no Slurm).
"""

import os
import shutil
import subprocess
import time

import pytest

from tests.helpers import REPO

START = os.path.join(os.path.dirname(os.path.abspath(__file__)), "start.sh")
TERMINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


class Slurm:
    """Runs Slurm's client commands against the test cluster (inside its namespace)."""

    def __init__(self, state_dir):
        self.state_dir = state_dir
        self.conf = os.path.join(state_dir, "slurm.conf")
        self.netns = os.path.join(state_dir, "netns")

    def env(self, extra=None):
        env = dict(
            os.environ,
            SLURM_CONF=self.conf,
            TF_CPP_MIN_LOG_LEVEL="2",
            PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
        )
        for name in list(env):
            if name.startswith("SLURM_") and name != "SLURM_CONF" or name == "TF_CONFIG":
                del env[name]
        env.update(extra or {})
        return env

    def run(self, *command, timeout=60, check=True, env=None, cwd=None):
        """Runs ``command`` (e.g. ``"sbatch", FILE``) in the cluster's namespace.

        Returns:
            The ``CompletedProcess``.
        """
        result = subprocess.run(
            ["nsenter", f"--net={self.netns}", *command],
            env=self.env(env),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"{command} exited {result.returncode}:\n{result.stdout}")
        return result

    def job(self, job_id):
        """``scontrol show job`` as a dict (JobState, ExitCode, Restarts, ...)."""
        out = self.run("scontrol", "show", "job", "-o", str(job_id)).stdout
        return dict(field.split("=", 1) for field in out.split() if "=" in field)

    def wait(self, job_id, timeout=300):
        """Polls until the job reaches a final state; returns its scontrol fields."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info["JobState"] in TERMINAL_STATES:
                return info
            if time.monotonic() > deadline:
                self.run("scancel", str(job_id), check=False)
                raise AssertionError(f"job {job_id} still {info['JobState']} after {timeout} s")
            time.sleep(0.5)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("a local Slurm cluster needs root (apt-get, nsenter, SlurmUser=root)")
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        pytest.skip("Slurm is not installed and apt-get is not available to install slurm-wlm")
    state_dir = str(tmp_path_factory.mktemp("slurm"))
    start = subprocess.run(
        [START, "start", state_dir],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    try:
        if start.returncode != 0:
            pytest.fail(
                f"tests/slurm/start.sh failed ({start.returncode}):\n{start.stdout}", pytrace=False
            )
        yield Slurm(state_dir)
    finally:
        subprocess.run([START, "stop", state_dir], timeout=60)
