"""Keras parity: each row through plain Keras on one device and the Trainer on mirrored x2.

Rows live in ``rows_*.py`` beside this file (``ROWS`` lists in each), collected by
:mod:`tests.keras_parity.rows`.
"""

import pytest

import tfdist
from tests.keras_parity.parity import assert_same, run_keras, run_trainer
from tests.keras_parity.rows import ROWS

_MIRRORED = []


def mirrored():
    if not _MIRRORED:
        _MIRRORED.append(tfdist.make_strategy("mirrored", num_devices=2))
    return _MIRRORED[0]


@pytest.mark.parametrize(
    "row",
    [
        pytest.param(r, id=r.name, marks=[pytest.mark.slow] if r.slow else [])
        for r in ROWS
        if "mirrored" in r.strategies
    ],
)
def test_trainer_on_mirrored_matches_keras(row):
    assert_same(row, run_keras(row), run_trainer(row, mirrored()))
