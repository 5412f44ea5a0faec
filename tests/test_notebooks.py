"""Runs every ``notebooks/*.ipynb`` top to bottom in a fresh kernel; any cell error fails.

    .venv/bin/python -m pytest tests/test_notebooks.py -q

The notebooks are stored with their outputs; a run must show what is stored (the
same cells, outputs of the same kinds, numbers within tolerance, plots of the same
size: ``tests/notebook_outputs.py``). ``make notebooks`` runs and stores them again.
New notebooks are picked up automatically. Each runs in its own kernel started
with this interpreter (the venv's), from the repository root, with quiet TF
logs and no TF_CONFIG, so it behaves as a first run on a user's machine.
"""

import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client import KernelManager
from nbclient.exceptions import CellExecutionError

from tests.notebook_outputs import KERNEL_NAME, NOTEBOOKS, differences, execute


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
def test_notebook_is_stored_with_the_outputs_of_a_run(path: Path):
    """Every code cell ran; test_notebook_runs checks that what it shows is a run's now."""
    nb = nbformat.read(path, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(cell.execution_count is not None for cell in code), (
        f"{path.name}: store it run (`make notebooks`), so that readers see its outputs."
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_stored_outputs_hold_no_stderr_but_in_a_cell_that_shows_a_fault(path: Path):
    """A reader on a code host sees no red blocks of TensorFlow's or absl's start-up noise.

    The notebooks quiet TensorFlow (``tfdist.quiet_tensorflow()``), ``notebook_launcher``
    quiets its tasks, and a warning meant for the reader is printed in the cell's text. Only a
    cell tagged ``fault`` (it kills a task on purpose) shows the launcher's messages as logs.
    """
    stderr = _stderr_outside_fault_cells(nbformat.read(path, as_version=4))
    assert not stderr, f"{path.name}: stderr in stored cells (cell, first line): {stderr}"


def _stderr_outside_fault_cells(nb):
    """(cell index, first line) of each stderr output in a cell not tagged ``fault``."""
    return [
        (i, output.text.splitlines()[0] if output.text.strip() else "")
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and "fault" not in cell.metadata.get("tags", [])
        for output in cell.outputs
        if output.output_type == "stream" and output.name == "stderr"
    ]


def test_every_notebook_that_measures_ends_in_a_plot():
    """Each notebook shows its figures as a plot; the last plot comes after its last run."""
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        plots = [
            i
            for i, cell in enumerate(nb.cells)
            for output in cell.get("outputs", [])
            if "image/png" in output.get("data", {})
        ]
        assert plots, f"{path.name} stores no plot"


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path):
    try:
        fresh = execute(path)
    except CellExecutionError as e:
        pytest.fail(f"{path.name} failed:\n{e}", pytrace=False)
    noise = _stderr_outside_fault_cells(fresh)
    assert not noise, f"{path.name}: a run now writes to stderr (cell, first line): {noise}"
    stale = differences(nbformat.read(path, as_version=4), fresh)
    assert not stale, (
        f"{path.name}: the stored outputs are not a run's now; `make notebooks`:\n"
        + ("\n".join(stale))
    )


def test_the_ray_notebook_is_scheduled_with_the_ray_tests():
    """tests/conftest.py names it, to keep two Ray clusters from starting at once."""
    from tests.conftest import RAY_NOTEBOOK

    assert RAY_NOTEBOOK in {
        f"tests/test_notebooks.py::test_notebook_runs[{p.name}]" for p in NOTEBOOKS
    }


def _notebook(*outputs, tags=()):
    """A one-cell notebook with these outputs."""
    cell = nbformat.v4.new_code_cell("print(1)", metadata={"tags": list(tags)})
    cell.outputs = list(outputs)
    return nbformat.v4.new_notebook(cells=[cell])


def _png(width, height):
    import base64
    import struct

    header = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR"
    return base64.b64encode(header + struct.pack(">II", width, height) + b"\x08\x06\0\0\0").decode()


def _stdout(text):
    return nbformat.v4.new_output("stream", name="stdout", text=text)


@pytest.mark.parametrize(
    "stored,fresh,stale",
    [
        ("accuracy 0.951 after 6 epochs\n", "accuracy 0.948 after 6 epochs\n", False),
        ("accuracy 0.951\n", "accuracy 0.612\n", True),  # beyond tolerance
        ("accuracy 0.951\n", "val_accuracy 0.951\n", True),  # other words
        ("6/6 - 1s - 95ms/step - loss: 0.4\n", "6/6 - 3s - 410ms/step - loss: 0.4\n", False),
        ("epoch 1 took 2.0 s\n", "epoch 1 took 9.5 s\n", False),  # a timing
        ("losses: [0.88  0.824]\n", "losses: [0.9 0.82 ]\n", False),  # NumPy's padding
    ],
)
def test_stored_text_must_match_a_run_up_to_tolerance_and_timings(stored, fresh, stale):
    assert bool(differences(_notebook(_stdout(stored)), _notebook(_stdout(fresh)))) == stale


def test_a_cell_tagged_varies_may_show_any_numbers():
    stored, fresh = _stdout("bf16 1.9x fp32\n"), _stdout("bf16 0.8x fp32\n")
    assert differences(_notebook(stored), _notebook(fresh))
    assert not differences(_notebook(stored, tags=["varies"]), _notebook(fresh, tags=["varies"]))


def test_output_kinds_and_plot_sizes_must_match_but_stderr_logs_do_not():
    plot = nbformat.v4.new_output("display_data", data={"image/png": _png(640, 480)})
    log = nbformat.v4.new_output("stream", name="stderr", text="W0000 a TF warning\n")
    assert not differences(_notebook(_stdout("a\n"), plot), _notebook(log, _stdout("a\n"), plot))
    wider = nbformat.v4.new_output("display_data", data={"image/png": _png(652, 480)})
    assert not differences(_notebook(plot), _notebook(wider))  # longer tick labels
    smaller = nbformat.v4.new_output("display_data", data={"image/png": _png(320, 240)})
    assert differences(_notebook(plot), _notebook(smaller)) == [
        "code cell 0: image/png [(640, 480)] stored, [(320, 240)] now"
    ]
    assert differences(_notebook(_stdout("a\n")), _notebook(_stdout("a\n"), plot))
    other = _notebook(_stdout("a\n"))
    other.cells[0].source = "print(2)"
    assert differences(_notebook(_stdout("a\n")), other) == ["the code cells differ"]


def test_a_cell_tagged_machine_shows_the_same_kinds_of_output_only():
    ours, theirs = _stdout("bf16 CPU features: ['avx512_bf16']\n"), _stdout("bf16: none\n")
    assert not differences(_notebook(ours, tags=["machine"]), _notebook(theirs, tags=["machine"]))
    plot = nbformat.v4.new_output("display_data", data={"image/png": _png(64, 48)})
    assert differences(_notebook(ours, tags=["machine"]), _notebook(ours, plot, tags=["machine"]))


def test_a_cell_tagged_fault_may_show_more_of_a_tasks_last_words_and_nothing_else():
    stored = _stdout("[worker:1] crashing on purpose after global batch 37\n{'attempt': 2}\n")
    # The survivor's traceback: printed or not, depending on whether the restart came first.
    fresh = _stdout(
        "[worker:0] Traceback (most recent call last):\n"
        "[worker:1] crashing on purpose after global batch 37\n{'attempt': 2}\n"
    )
    assert differences(_notebook(stored), _notebook(fresh))  # untagged: a new line is a change
    assert not differences(_notebook(stored, tags=["fault"]), _notebook(fresh, tags=["fault"]))
    # A stored line that is gone, or a new line that is not a task's: still a change.
    gone = _stdout("{'attempt': 2}\n")
    assert differences(_notebook(stored, tags=["fault"]), _notebook(gone, tags=["fault"]))
    other = _stdout("[worker:1] crashing on purpose after global batch 37\n{'attempt': 3}\nhi\n")
    assert differences(_notebook(stored, tags=["fault"]), _notebook(other, tags=["fault"]))
