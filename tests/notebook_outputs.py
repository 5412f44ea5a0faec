"""Runs the notebooks, and tells whether their stored outputs are those a run gives now.

    .venv/bin/python -m tests.notebook_outputs [notebooks/NAME.ipynb ...]   # `make notebooks`

runs each notebook (all of them by default) top to bottom in a fresh kernel and stores it
with its outputs, plots included, so that a reader on a code host sees them.
``tests/test_notebooks.py`` runs them again and compares, cell by cell, what a run shows
(:func:`outline`) with what is stored.

What must match:

- the same code cells, with the same source;
- outputs of the same kinds (stdout text, a returned value, a PNG, ...); stderr and log
  lines are left out (they differ from run to run), and so are temporary paths;
- text with its numbers masked: the same lines, in any order (two workers' lines interleave);
- numbers within :data:`RTOL` relative or :data:`ATOL` absolute of the stored ones, except
  timings (a number with a unit of time), which depend on the machine and the moment, and
  any number in a cell tagged ``varies`` (speed-ups, or where a crashed run's last
  asynchronous backup happened to end);
- in a cell tagged ``machine`` (what it shows depends on the CPU), only the kinds of output.
- in a cell tagged ``fault`` (it kills a task on purpose, and also tagged ``varies``): every
  stored line, and no other line but a task's (``[worker:0] ...``): a task interrupted by
  the fault prints its last words (a traceback, a log line) or not, depending on whether the
  launcher's restart reaches it first.
- plots of about the same pixel size (within :data:`SIZE_RTOL`: a tight bounding box grows
  with the widths of the axis labels).
"""

from __future__ import annotations

import base64
import math
import os
import re
import struct
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))
KERNEL_NAME = "python3"
CELL_TIMEOUT_S = 300
#: How far a stored number may be from a fresh run's: losses and accuracies of seeded runs move
#: in their last digits between machines (oneDNN kernels, bf16 support).
RTOL, ATOL = 0.1, 0.02
SIZE_RTOL = 0.1
VARIES_TAG = "varies"
MACHINE_TAG = "machine"
FAULT_TAG = "fault"
_TASK_LINE = re.compile(r"^\[\w+:#\]")  # a task's line, once masked: "[worker:#]..."
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
# A number with a unit of time (Keras's "12ms/step", "3s", "0.25 s per step") is a timing.
_TIMING = re.compile(
    r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?\s?(?:ms|us|µs|s|min)(?:/step)?\b"
)
# Log lines (TF's and absl's, Python logging's, a launched task's copies of them) and what
# differs between any two runs: temporary directories, object addresses.
_LOG_LINE = re.compile(
    r"^(\[\w+:\d+\] )?(INFO:|WARNING:|ERROR:|[IWEF]\d{4} |WARNING: All log messages)"
)
_TEMP_PATH = re.compile(r"/tmp/[^\s'\",)]+")
_ADDRESS = re.compile(r"\b0x[0-9a-f]{6,}")


def kernel_env() -> dict[str, str]:
    """The environment of a first run on a user's machine: no TF log level set, no cluster.

    The notebooks quiet TensorFlow themselves (``tfdist.quiet_tensorflow()``), as a user's would.
    """
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    env.pop("TF_CONFIG", None)  # a stray cluster would turn "auto"/multi-worker code into a hang
    # A user's launches start their own preloaded Python (its import's lines are in the outputs),
    # not one the test session shares (tests/shared_preload.py).
    env.pop("TFDIST_PRELOAD_SERVER", None)
    env.pop("MPLBACKEND", None)  # let ipykernel pick its non-interactive inline backend
    return env


def execute(path: Path) -> nbformat.NotebookNode:
    """``path`` run top to bottom in a fresh kernel of this interpreter, from the repository root.

    Raises:
        nbclient.exceptions.CellExecutionError: If a cell raised.
    """
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name=KERNEL_NAME,
        resources={"metadata": {"path": str(REPO_ROOT)}},
    )
    client.execute(env=kernel_env())
    return nb


def _png_size(data: str) -> tuple[int, int]:
    """Width and height of a base64 PNG (from its IHDR chunk)."""
    raw = base64.b64decode(data)
    return struct.unpack(">II", raw[16:24])


def _text(value: str | list[str]) -> str:
    return value if isinstance(value, str) else "".join(value)


def _lines(text: str) -> list[str]:
    """The lines a reader reads: log lines dropped, temporary paths and addresses masked."""
    lines = []
    for line in text.replace("\r", "\n").splitlines():
        if not line.strip() or _LOG_LINE.match(line):
            continue
        line = _ADDRESS.sub("0x…", _TEMP_PATH.sub("/tmp/…", line))
        lines.append(line.replace("Overwriting /tmp/", "Writing /tmp/"))  # %%writefile, again
    return lines


def outline(nb: nbformat.NotebookNode) -> list[dict[str, object]]:
    """Per code cell: its source, whether it is tagged ``varies``, and what it shows.

    ``shows`` maps each kind of output (``stdout``, a returned or displayed MIME type,
    ``error``) to what is compared: the text's lines (a cell's stdout may arrive in any
    number of pieces), a PNG's size, or nothing. stderr (logs) is left out.
    """
    cells = []
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        shows: dict[str, list[object]] = {}
        for output in cell.outputs:
            if output.output_type == "stream":
                if output.name == "stdout":
                    shows.setdefault("stdout", []).extend(_lines(_text(output.text)))
            elif output.output_type == "error":
                shows.setdefault("error", []).append(output.ename)
            else:
                for mime, data in output.get("data", {}).items():
                    value = _png_size(_text(data)) if mime == "image/png" else None
                    if mime.startswith("text/"):
                        shows.setdefault(mime, []).extend(_lines(_text(data)))
                    else:
                        shows.setdefault(mime, []).append(value)
        tags = cell.get("metadata", {}).get("tags", [])
        if MACHINE_TAG in tags:
            shows = {kind: [] for kind in shows}
        cells.append(
            {
                "source": _text(cell.source),
                "varies": VARIES_TAG in tags or FAULT_TAG in tags,
                "fault": FAULT_TAG in tags,
                "shows": shows,
            }
        )
    return cells


def _masked(line: str, varies: bool) -> tuple[str, list[float]]:
    """``line`` with timings masked as ``T`` and other numbers as ``#``; those numbers."""
    line = _TIMING.sub("T", line)
    numbers = [] if varies else [float(n) for n in _NUMBER.findall(line)]
    # Whitespace goes: columns and NumPy's arrays are padded to the widths of their numbers.
    return "".join(_NUMBER.sub("#", line).split()), numbers


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=RTOL, abs_tol=ATOL) or (math.isnan(a) and math.isnan(b))


def _fault_differences(where: str, old: list[str], new: list[str]) -> list[str]:
    """A fault cell's lines: each stored one shown now, and nothing new but a task's lines."""
    old_texts = {_masked(line, True)[0] for line in old}
    new_texts = {_masked(line, True)[0] for line in new}
    gone = sorted(old_texts - new_texts)
    added = sorted(t for t in new_texts - old_texts if not _TASK_LINE.match(t))
    if gone or added:
        return [f"{where}: lines stored but not shown now {gone}, shown now but not stored {added}"]
    return []


def _text_differences(
    where: str, old: list[str], new: list[str], varies: bool, fault: bool = False
) -> list[str]:
    """Lines compared in sorted order (two workers' lines interleave in any order)."""
    if fault:
        return _fault_differences(where, old, new)
    old_lines = sorted(_masked(line, varies) for line in old)
    new_lines = sorted(_masked(line, varies) for line in new)
    if [text for text, _ in old_lines] != [text for text, _ in new_lines]:
        gone = sorted({t for t, _ in old_lines} - {t for t, _ in new_lines})
        added = sorted({t for t, _ in new_lines} - {t for t, _ in old_lines})
        return [f"{where}: lines stored but not shown now {gone}, shown now but not stored {added}"]
    return [
        f"{where}: {text!r}: {b} now, {a} stored"
        for (text, a), (_, b) in zip(old_lines, new_lines)
        if len(a) != len(b) or not all(_close(x, y) for x, y in zip(a, b))
    ]


def _same_sizes(old: list[object], new: list[object]) -> bool:
    """PNG sizes within SIZE_RTOL of each other, side by side (other data: equal)."""
    if len(old) != len(new):
        return False
    return all(
        a == b
        or (
            isinstance(a, tuple)
            and isinstance(b, tuple)
            and all(math.isclose(p, q, rel_tol=SIZE_RTOL) for p, q in zip(a, b))
        )
        for a, b in zip(old, new)
    )


def differences(stored: nbformat.NotebookNode, fresh: nbformat.NotebookNode) -> list[str]:
    """What a fresh run shows that the stored notebook does not (empty: the outputs are current)."""
    old, new = outline(stored), outline(fresh)
    if [c["source"] for c in old] != [c["source"] for c in new]:
        return ["the code cells differ"]
    found = []
    for i, (a, b) in enumerate(zip(old, new)):
        if sorted(a["shows"]) != sorted(b["shows"]):
            found.append(
                f"code cell {i}: shows {sorted(a['shows'])} stored, {sorted(b['shows'])} now"
            )
            continue
        for kind, x in a["shows"].items():
            y = b["shows"][kind]
            if kind in ("stdout", "error") or kind.startswith("text/"):
                found += _text_differences(f"code cell {i} {kind}", x, y, a["varies"], a["fault"])
            elif not _same_sizes(x, y):
                found.append(f"code cell {i}: {kind} {x} stored, {y} now")
    return found


def main(paths: list[str]) -> int:
    """Runs and stores each notebook; a failing one is left as it was."""
    for path in [Path(p) for p in paths] or NOTEBOOKS:
        print(f"running {path.name} ...", flush=True)
        nb = execute(path)
        nbformat.write(nb, path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
