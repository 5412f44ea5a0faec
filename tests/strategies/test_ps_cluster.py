"""The in-process PS cluster: reused per shape, exposure warned, late connect refused."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import pytest

import tfdist
from tests.helpers import REPO
from tests.jobs.common import builder, dataset
from tests.strategies.ps_common import ps_strategy

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def listening_ports(pid=None):
    """``ss -ltnp``: (local address, port) of the TCP sockets process ``pid`` listens on."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    pid = pid or os.getpid()
    found = set()
    for line in out.splitlines():
        if f"pid={pid}," in line:
            host, _, port = line.split()[3].rpartition(":")
            found.add((host, int(port)))
    return found


def test_same_shape_reuses_the_servers_and_each_strategy_trains():
    from tfdist.strategies.parameter_server import in_process_servers

    first = ps_strategy(num_workers=2, num_ps=1)
    ports = listening_ports()
    # 2 workers + 1 ps + the coordinator's own server.
    assert len(ports) >= 4
    for _ in range(3):
        again = ps_strategy(num_workers=2, num_ps=1)
        servers = in_process_servers(first)
        assert again is not first and servers and in_process_servers(again) is servers
        assert listening_ports() == ports  # no new servers, no new coordinator port
    # A new strategy (and coordinator) over the same servers trains.
    trainer = tfdist.Trainer(builder(), strategy=again, optimizer="sgd", loss=LOSS)
    trainer.fit(
        lambda ctx: dataset(96, 16), epochs=1, steps_per_epoch=4, global_batch_size=16, verbose=0
    )
    assert int(trainer.model.optimizer.iterations.numpy()) == 4
    assert listening_ports() == ports


_FRESH_PROCESS = textwrap.dedent("""
    import json, logging, os, subprocess
    import tensorflow as tf
    import tfdist
    from tests.strategies.test_ps_cluster import listening_ports

    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("tfdist.strategies.parameter_server").addHandler(handler)
    early = tf.data.Dataset.range(3)  # TensorFlow work before make_strategy
    result = {}
    try:
        tfdist.make_strategy("parameter_server", num_workers=1, num_ps=1)
    except ValueError as e:
        result["error"] = str(e)
    result["early_still_works"] = [int(v) for v in early]
    tfdist.make_strategy("parameter_server", num_workers=1, num_ps=1, allow_late_connect=True)
    tfdist.make_strategy("parameter_server", num_workers=1, num_ps=1)  # connected now: allowed
    result["warnings"] = [m for m in records if "every network interface" in m]
    result["listening"] = sorted(listening_ports())
    print("RESULT" + json.dumps(result))
""")


@pytest.fixture(scope="module")
def fresh_process():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO}
    env.pop("TF_CONFIG", None)
    proc = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(line[len("RESULT") :])


def test_make_strategy_after_other_tensorflow_work_is_refused(fresh_process):
    error = fresh_process["error"]
    assert error.startswith(
        "Invalid value for argument `allow_late_connect`. Received: allow_late_connect=False."
    )
    assert "TensorFlow has already started" in error and "/job:localhost" in error
    assert fresh_process["early_still_works"] == [0, 1, 2]  # refusing left the process intact


def test_exposure_is_warned_once_and_is_what_ss_shows(fresh_process):
    # TF's gRPC servers bind every interface, whatever host the cluster names:
    # the socket table shows it, and the one warning says so and names the ports.
    listening = fresh_process["listening"]
    assert listening and all(host in ("*", "0.0.0.0", "[::]") for host, _ in listening)
    assert len(fresh_process["warnings"]) == 1
    warning = fresh_process["warnings"][0]
    assert "iptables" in warning
    named = {int(p) for p in warning.split("--dports ")[1].split()[0].split(",")}
    assert named == {
        port for _, port in listening
    }  # every listening port, the coordinator's own included
