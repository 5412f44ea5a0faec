"""Helpers for tests that start real processes."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_tfdist(*args, env=None, timeout=300):
    """Runs ``python -m tfdist ARGS`` and returns the CompletedProcess (text, merged output)."""
    full_env = dict(os.environ)
    full_env.pop("TF_CONFIG", None)
    full_env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    full_env["PYTHONPATH"] = REPO + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "tfdist", *args], cwd=REPO, env=full_env, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
