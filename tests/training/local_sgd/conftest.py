"""The local-SGD test modules' mirrored x2 strategy, one per module."""

import pytest

import tfdist


@pytest.fixture(scope="module")
def mirrored():
    return tfdist.make_strategy("mirrored", num_devices=2)
