"""docs/keras-parity.md's table stays in step with Keras and with the suite (no training).

Each entry is ``| Keras | kind | status | tests |``: kind ``fit`` (a ``keras.Model.fit``
parameter), ``callback`` (a class in ``keras.callbacks``) or ``model`` (an override or a kind of
model, :data:`MODEL_FEATURES`). Tests cites parity rows (``Row.name``) and test functions, then
after ``to verify:`` the names expected to cover the entry once they land.
"""

import dataclasses
import inspect
import pathlib
import re

import keras
import pytest

from tests.helpers import REPO
from tests.keras_parity.rows import ROWS

PAGE = pathlib.Path(REPO) / "docs" / "keras-parity.md"
WHERE = "docs/keras-parity.md"
TESTS = pathlib.Path(REPO) / "tests"
SECTION = "Keras parity"
MODEL_FEATURES = (
    "train_step",
    "test_step",
    "predict_step",
    "compute_loss",
    "call",
    "compiled model",
    "multi-input model",
    "multi-output model",
    "masked model",
    "embedding (sparse gradients)",
    "model built outside the scope",
    "adapted preprocessing layers",
    "metric objects",
    "learning-rate schedule",
    "add_loss",
)
STATUS = re.compile(r"^(supported|supported \(.+\)|refused: .+)$")
VERIFY = "to verify:"


@dataclasses.dataclass(frozen=True)
class Entry:
    line: int
    name: str
    kind: str
    status: str
    tested: tuple[str, ...]
    to_verify: tuple[str, ...]


def fit_parameters():
    return [p for p in inspect.signature(keras.Model.fit).parameters if p != "self"]


def callback_classes():
    return sorted(
        name
        for name, value in vars(keras.callbacks).items()
        if isinstance(value, type) and issubclass(value, keras.callbacks.Callback)
    )


def expected():
    """kind -> the names that need an entry, and nothing else may have one."""
    return {"fit": fit_parameters(), "callback": callback_classes(), "model": list(MODEL_FEATURES)}


def table():
    """The table's entries, with their line numbers in the page."""
    lines = PAGE.read_text().splitlines()
    start = lines.index(f"# {SECTION}")
    entries = []
    for number, line in enumerate(lines[start + 1 :], start + 2):
        if line.startswith("## "):
            break
        if not line.startswith("| ") or line.startswith("| Keras |"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"{WHERE}:{number}: want 4 cells (Keras|kind|status|tests): {line}"
        name, kind, status, tests = cells
        tested, _, to_verify = tests.partition(VERIFY)
        names = lambda text: tuple(re.findall(r"`([^`]+)`", text))  # noqa: E731
        entries.append(
            Entry(number, name.strip("`"), kind, status, names(tested), names(to_verify))
        )
    return entries


def defined_test_functions():
    found = set()
    for path in TESTS.rglob("*.py"):
        found.update(re.findall(r"^\s*def (test_\w+)", path.read_text(), flags=re.M))
    return found


@pytest.fixture(scope="module")
def entries():
    return table()


def row(kind, name):
    return f"'| `{name}` | {kind} | <status> | <parity rows or tests> |'"


@pytest.mark.parametrize("kind", ["fit", "callback", "model"])
def test_every_keras_name_has_an_entry(entries, kind):
    """(a) every fit parameter, (b) every callback class, and every model feature has a row."""
    shown = {e.name for e in entries if e.kind == kind}
    missing = [name for name in expected()[kind] if name not in shown]
    assert not missing, (
        f"{WHERE}'s '{SECTION}' table has no {kind} entry for {missing} "
        f"(keras {keras.__version__}): add "
        + ", ".join(row(kind, name) for name in missing)
        + " with the real status and the rows/tests that cover it"
    )


def test_no_entry_names_something_else(entries):
    """(d) each entry is a fit parameter, a callback class or a known model feature, once."""
    known = expected()
    wrong = [
        f"{WHERE}:{e.line} `{e.name}` ({e.kind})"
        for e in entries
        if e.name not in known.get(e.kind, ())
    ]
    assert not wrong, (
        f"remove or rename these entries: {wrong}. Kinds: 'fit' takes a parameter of "
        f"keras.Model.fit {known['fit']}; 'callback' a class in keras.callbacks; 'model' one of "
        f"{list(MODEL_FEATURES)} (a new feature: add it to MODEL_FEATURES in {__name__})"
    )
    names = [(e.kind, e.name) for e in entries]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"one entry per name: remove the extra entries of {twice}"


def test_statuses_and_citations_are_well_formed(entries):
    bad = [
        f"{WHERE}:{e.line} `{e.name}`: {e.status!r}" for e in entries if not STATUS.match(e.status)
    ]
    assert not bad, f"a status is 'supported', 'supported (note)' or 'refused: gist'; fix {bad}"
    bare = [f"{WHERE}:{e.line} `{e.name}`" for e in entries if not (e.tested or e.to_verify)]
    assert not bare, f"cite the parity rows or tests that cover {bare} (or 'to verify: `name`')"


@pytest.fixture(scope="module")
def suite():
    """Every parity row name and every test function name under tests/."""
    return {r.name for r in ROWS} | defined_test_functions()


def test_every_cited_name_exists(entries, suite):
    """(c) tested names are parity rows or test functions."""
    unknown = [
        f"{WHERE}:{e.line} `{e.name}` cites `{n}`"
        for e in entries
        for n in e.tested
        if n not in suite
    ]
    assert not unknown, (
        f"{unknown}: neither a Row.name in tests/keras_parity/rows_*.py nor a test function "
        f"under tests/. Fix the name, or move it after '{VERIFY}' if it is still to come"
    )


def test_to_verify_names_are_still_to_come(entries, suite):
    """A 'to verify' name that landed moves to the tested names, its status checked."""
    landed = [
        f"{WHERE}:{e.line} `{e.name}`: `{n}`" for e in entries for n in e.to_verify if n in suite
    ]
    assert not landed, (
        f"{landed} exist now: move each before '{VERIFY}' (with the tested names), and check "
        "that the entry's status says what the row or test shows"
    )
