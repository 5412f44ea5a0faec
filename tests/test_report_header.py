"""The run's header names the machine and how fast it started TensorFlow that day."""

import re

from tests.conftest import pytest_report_header


def test_the_header_names_the_cpu_its_flags_and_the_import_cost():
    header = pytest_report_header(None)
    assert header.startswith("machine: ")
    assert re.search(r"\d+ usable cores; CPU flags: ", header), header
    assert re.search(r"oneDNN (on|off); importing TensorFlow, Keras and tfdist took ", header)
    seconds = float(re.search(r"took (\d+\.\d) CPU-s$", header).group(1))
    assert seconds > 0.5  # a real import, not a zero from a misplaced clock
