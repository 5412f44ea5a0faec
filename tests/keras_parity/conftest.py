"""The parity modules' shared mirrored strategy."""

import pytest

import tfdist


@pytest.fixture(scope="session")
def mirrored():
    """One mirrored x2 strategy for every parity test (each new one adds device state)."""
    return tfdist.make_strategy("mirrored", num_devices=2)
