"""make_strategy: every registered kind, options, and the errors users see."""

import json

import pytest
import tensorflow as tf

import tfdist
from tfdist import cluster, config
from tfdist.strategies import factory, multi_worker, registry


def test_available_names():
    assert {"auto", "one_device", "mirrored", "multi_worker"} <= set(factory.available())


def test_one_list_of_names():
    """config.StrategyName is the list: the CLI's choices and the registry's keys come from it."""
    assert factory.available() == registry.names() == tuple(sorted(config.STRATEGY_NAMES))
    assert set(registry.MODULES) == set(config.STRATEGY_NAMES) - {"auto"}
    for entry in registry.entries():  # every kind's module defines build, RUNNER and matches
        assert callable(entry.build) and callable(entry.runner) and callable(entry.matches)


def _tfdist_imports(path):
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tfdist"):
            found |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("tfdist")}
    return found


def test_the_registry_is_a_leaf():
    """No import circles: the registry imports no strategy; none imports it or the factory."""
    import pathlib

    folder = pathlib.Path(registry.__file__).parent
    allowed = {"tfdist.config", "tfdist.config.STRATEGY_NAMES"}
    assert _tfdist_imports(folder / "registry.py") <= allowed
    for path in folder.glob("*.py"):
        if path.stem not in ("factory", "registry"):
            circular = ("tfdist.strategies.factory", "tfdist.strategies.registry")
            assert not {m for m in _tfdist_imports(path) if m.startswith(circular)}, path.name


def test_broken_strategy_module_raises_its_import_error(monkeypatch, tmp_path):
    """A strategy module that fails to import is an error, not a kind that silently disappears."""
    (tmp_path / "tfdist_broken_strategy.py").write_text("import tfdist_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.MODULES, "one_device", "tfdist_broken_strategy")
    with pytest.raises(ImportError, match="tfdist_missing_dependency"):
        tfdist.make_strategy("one_device")
    with pytest.raises(ImportError, match="tfdist_missing_dependency"):
        factory.runner_for(tf.distribute.get_strategy())
    assert "one_device" in factory.available()


def test_unknown_kind_lists_the_valid_ones():
    with pytest.raises(ValueError) as e:
        tfdist.make_strategy("mirored")
    msg = str(e.value)
    assert msg.startswith(
        "Invalid value for argument `strategy`. Received: strategy='mirored'. Expected one of: "
    )
    assert "mirrored" in msg and "multi_worker" in msg and "one_device" in msg


def test_unknown_option():
    with pytest.raises(
        ValueError,
        match="argument `num_gpus`. Received: num_gpus=2. Expected an option of "
        "strategy 'mirrored': num_devices",
    ):
        tfdist.make_strategy("mirrored", num_gpus=2)


@pytest.mark.parametrize(
    "kind,options,replicas,cls",
    [
        ("one_device", {}, 1, tf.distribute.OneDeviceStrategy),
        ("mirrored", {"num_devices": 2}, 2, tf.distribute.MirroredStrategy),
        ("mirrored", {"num_devices": 4}, 4, tf.distribute.MirroredStrategy),
        ("multi_worker", {}, 1, tf.distribute.MultiWorkerMirroredStrategy),
    ],
)
def test_kinds(kind, options, replicas, cls):
    strategy = tfdist.make_strategy(kind, **options)
    assert isinstance(strategy, cls) and strategy.num_replicas_in_sync == replicas
    with strategy.scope():
        v = tf.Variable(1.0)
    assert strategy.extended.variable_created_in_scope(v)
    assert factory.runner_for(strategy).strategy is strategy


def test_auto_without_cluster_is_mirrored(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert isinstance(tfdist.make_strategy("auto"), tf.distribute.MirroredStrategy)


def test_num_devices_after_tf_initialised():
    tf.constant(1.0)  # TF is initialised with the 4 devices of tests/conftest.py
    with pytest.raises(
        ValueError, match="argument `num_devices`. Received: num_devices=8. Expected at most 4"
    ):
        tfdist.make_strategy("mirrored", num_devices=8)
    with pytest.raises(ValueError, match="argument `num_devices`. Received: num_devices=0"):
        tfdist.make_strategy("mirrored", num_devices=0)


def test_communication_errors():
    with pytest.raises(ValueError, match="argument `communication`. Received: communication='tcp'"):
        tfdist.make_strategy("multi_worker", communication="tcp")
    with pytest.raises(
        ValueError, match="argument `communication`. Received: communication='nccl'.*without GPUs"
    ):
        tfdist.make_strategy("multi_worker", communication="nccl")


def test_stage_devices_errors():
    tf.constant(1.0)  # TF is initialised with the 4 devices of tests/conftest.py
    with pytest.raises(ValueError, match="argument `stage_devices`. Received: stage_devices=0"):
        tfdist.make_strategy("multi_worker", stage_devices=0)
    with pytest.raises(
        ValueError, match="argument `stage_devices`. Received: stage_devices=8. Expected at most 4"
    ):
        tfdist.make_strategy("multi_worker", stage_devices=8)


def test_a_multi_worker_cluster_resolver_names_the_gpus_of_each_replica():
    """MultiWorkerMirroredStrategy reads each worker's GPUs from its resolver; one without them
    would train a GPU host's workers on their CPUs."""
    info = cluster.ClusterInfo(
        cluster={"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, task_type="worker", task_id=0
    )
    assert multi_worker.resolver_for(info, 2).num_accelerators() == {"GPU": 2}
    assert multi_worker.resolver_for(info).num_accelerators() == {}  # as parameter_server's


@pytest.mark.parametrize(
    "tf_config,pattern",
    [
        ("{not json", r"argument `TF_CONFIG`"),
        (json.dumps({"task": {"type": "worker", "index": 0}}), r"TF_CONFIG.cluster"),
        (
            json.dumps(
                {"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "chief", "index": 0}}
            ),
            r"TF_CONFIG.task.type",
        ),
        (
            json.dumps(
                {"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 3}}
            ),
            r"TF_CONFIG.task.index",
        ),
        (
            json.dumps(
                {
                    "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:1"]},
                    "task": {"type": "worker", "index": 0},
                }
            ),
            r"127.0.0.1:1",
        ),
    ],
)
def test_malformed_tf_config(monkeypatch, tf_config, pattern):
    monkeypatch.setenv("TF_CONFIG", tf_config)
    with pytest.raises(ValueError, match=pattern):
        tfdist.make_strategy("multi_worker")


def test_multi_worker_refuses_a_ps_cluster(monkeypatch):
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {
                "cluster": {"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]},
                "task": {"type": "worker", "index": 0},
            }
        ),
    )
    with pytest.raises(ValueError, match="'parameter_server' for a cluster with ps tasks"):
        tfdist.make_strategy("multi_worker")


def test_runner_for_an_unsupported_strategy():
    strategy = tf.distribute.experimental.CentralStorageStrategy()
    with pytest.raises(
        ValueError, match="argument `strategy`. Received: strategy='CentralStorageStrategy'"
    ):
        factory.runner_for(strategy)
