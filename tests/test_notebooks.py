"""Runs every ``notebooks/*.ipynb`` top to bottom in a fresh kernel; any cell error fails.

    .venv/bin/python -m pytest tests/test_notebooks.py -q

New notebooks are picked up automatically. Each runs in its own kernel started
with this interpreter (the venv's), from the repository root, with quiet TF
logs and no TF_CONFIG, so it behaves as a first run on a user's machine.
"""

import os
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
KERNEL_NAME = "python3"
CELL_TIMEOUT_S = 300


def _kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.pop("TF_CONFIG", None)  # a stray cluster would turn "auto"/multi-worker code into a hang
    env.pop("MPLBACKEND", None)  # let ipykernel pick its non-interactive inline backend
    return env


@pytest.mark.notebook
def test_kernel_runs_this_interpreter():
    """The "python3" kernel must start with this venv's Python, where tfdist is installed.

    ipykernel installs a "python3" kernelspec into ``<venv>/share/jupyter`` whose
    argv starts with a bare ``python``; jupyter_client prefers the venv's spec
    and replaces that ``python`` by ``sys.executable``. A kernelspec elsewhere on
    JUPYTER_PATH could shadow it, hence this check.
    """
    cmd = KernelManager(kernel_name=KERNEL_NAME).format_kernel_cmd()
    assert cmd[0] == sys.executable, (
        f"Kernel {KERNEL_NAME!r} would start {cmd[0]!r}, not this interpreter {sys.executable!r}. "
        "Check `jupyter kernelspec list` for a python3 kernelspec shadowing the venv's."
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_stored_without_outputs(path: Path):
    nb = nbformat.read(path, as_version=4)
    with_outputs = [
        i
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)
    ]
    assert not with_outputs, (
        f"{path.name}: clear the outputs of cells {with_outputs} before committing."
    )


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name=KERNEL_NAME,
        resources={"metadata": {"path": str(REPO_ROOT)}},
    )
    try:
        client.execute(env=_kernel_env())
    except CellExecutionError as e:
        pytest.fail(f"{path.name} failed:\n{e}", pytrace=False)


def test_the_ray_notebook_is_scheduled_with_the_ray_tests():
    """tests/conftest.py names it, to keep two Ray clusters from starting at once."""
    from tests.conftest import RAY_NOTEBOOK

    assert RAY_NOTEBOOK in {
        f"tests/test_notebooks.py::test_notebook_runs[{p.name}]" for p in NOTEBOOKS
    }
