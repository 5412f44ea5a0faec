"""The parallelisms meet in one place (tfdist/training/updates.py): neither ZeRO's package nor
the pipeline's imports the other, lazily or not; the choice of update is tested by the runs in
tests/training/zero/ and tests/training/pipeline/ (the hybrid: tests/strategies/)."""

import ast
import pathlib

import pytest

TRAINING = pathlib.Path(__file__).resolve().parents[2] / "tfdist" / "training"


def _imports(package: str) -> set[str]:
    names = set()
    for path in (TRAINING / package).glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
    return names


@pytest.mark.parametrize("package, other", [("zero", "pipeline"), ("pipeline", "zero")])
def test_zero_and_pipeline_do_not_import_each_other(package, other):
    reached = sorted(n for n in _imports(package) if n.startswith(f"tfdist.training.{other}"))
    assert reached == []


def test_the_updates_are_combined_in_updates_py_only():
    """No other module of the training package names the sharded and the pipeline update."""
    both = [
        str(path.relative_to(TRAINING))
        for path in TRAINING.rglob("*.py")
        if "ShardedUpdate" in (text := path.read_text()) and "PipelineUpdate" in text
    ]
    assert both == ["updates.py"]
