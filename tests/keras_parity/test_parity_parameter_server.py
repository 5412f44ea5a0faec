"""Keras parity on a real in-process parameter-server cluster with ONE worker.

One worker takes the steps one after another in order, reading the whole dataset repeated, so
it sees Keras's batches in Keras's order; each step's update lands on the parameter server
before the next step reads the variables. The harness gives ``steps_per_epoch`` (which PS
requires) as one pass over the data when a row has none (``parity.one_pass_steps``). A row
that cannot match here for a reason of PS's own leaves "parameter_server" out of its
strategies.
"""

import pytest

from tests.keras_parity.parity import assert_same, rows_on, run_trainer
from tests.keras_parity.rows import ROWS
from tests.strategies.ps_common import ps_strategy


@pytest.fixture(scope="module")
def ps():
    """One cluster for every row (its start-up is most of the cost)."""
    return ps_strategy(num_workers=1, num_ps=1)


@pytest.mark.parametrize("row", rows_on("parameter_server", ROWS))
def test_trainer_on_parameter_server_matches_keras(row, ps, keras_reference):
    assert_same(row, keras_reference(row), run_trainer(row, ps))
