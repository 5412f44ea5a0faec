"""Keras parity: each row through plain Keras on one device and the Trainer on mirrored x2.

Rows live in ``rows_*.py`` beside this file (``ROWS`` lists in each), collected by
:mod:`tests.keras_parity.rows`. The multi_worker and parameter_server runs of the same rows are
in ``test_parity_multi_worker.py`` and ``test_parity_parameter_server.py``.
"""

import pytest

from tests.keras_parity.parity import assert_same, rows_on, run_trainer
from tests.keras_parity.rows import ROWS


@pytest.mark.parametrize("row", rows_on("mirrored", ROWS))
def test_trainer_on_mirrored_matches_keras(row, mirrored, keras_reference):
    assert_same(row, keras_reference(row), run_trainer(row, mirrored))
