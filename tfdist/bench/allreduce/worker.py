"""What each worker of ``tfdist bench --benchmarks=allreduce`` runs (its parent: ``parent.py``).

For every message size, communication implementation, packing and dtype, one
``tf.function`` runs ``iters`` all-reduces in a loop, each one's input the
previous one's output (zeros, so the sums stay zero): TF cannot merge them,
and the loop is not unrolled. Then, in the same two processes, a loopback TCP
transfer of the same sizes (worker 0 receives, worker 1 sends) and, on worker
0, a numpy copy: what one host can move at most.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import numpy as np
import tensorflow as tf

import tfdist
from tfdist.bench.harness.timing import median
from tfdist.bench.harness.worker_common import report_progress, task

_IMPLEMENTATIONS = {
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}
DTYPES = {"float32": tf.float32, "bfloat16": tf.bfloat16}


def iterations(nbytes: int, spec: dict[str, Any]) -> int:
    """All-reduces per timed call: about ``spec["bytes_per_call"]``, in [min_iters, max_iters]."""
    return int(
        min(spec["max_iters"], max(spec["min_iters"], spec["bytes_per_call"] // max(nbytes, 1)))
    )


def _pieces(elements: int, count: int) -> list[int]:
    count = max(1, min(count, elements))
    base = elements // count
    return [base + (1 if i < elements % count else 0) for i in range(count)]


def time_allreduce(
    strategy: tf.distribute.Strategy,
    sizes: list[int],
    dtype: tf.DType,
    options: tf.distribute.experimental.CommunicationOptions,
    iters: int,
    repeats: int,
) -> list[float]:
    """Seconds per all-reduce of tensors of ``sizes`` elements (``repeats`` calls of ``iters``)."""

    def one(*tensors: tf.Tensor) -> list[tf.Tensor]:
        # tf.identity in the replica function puts the inputs on the replica's device: made in
        # cross-replica context they have none, and the all-reduce would have no destination.
        placed = [tf.identity(t) for t in tensors]
        return tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, placed, options=options
        )

    @tf.function
    def loop(n: tf.Tensor) -> tf.Tensor:
        tensors = [tf.zeros([s], dtype) for s in sizes]
        for _ in tf.range(n):
            tensors = [
                strategy.experimental_local_results(t)[0] for t in strategy.run(one, args=tensors)
            ]
        return tf.add_n([tf.cast(t[0], tf.float32) for t in tensors])

    loop(tf.constant(1)).numpy()  # trace, and connect
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        loop(tf.constant(iters)).numpy()
        out.append((time.perf_counter() - start) / iters)
    return out


def sweep(strategy: tf.distribute.Strategy, spec: dict[str, Any]) -> list[dict[str, Any]]:
    implementations = [
        i for i in spec["implementations"] if i != "nccl" or tf.config.list_physical_devices("GPU")
    ]
    rows = []
    total = len(implementations) * len(spec["packings"]) * len(spec["dtypes"])
    for impl in implementations:
        for packing, (count, per_pack) in spec["packings"].items():
            for dtype_name in spec["dtypes"]:
                points = []
                for fp32_bytes in spec["sizes"]:
                    elements = max(1, fp32_bytes // 4)
                    dtype = DTYPES[dtype_name]
                    nbytes = elements * dtype.size
                    iters = iterations(nbytes, spec)
                    options = tf.distribute.experimental.CommunicationOptions(
                        bytes_per_pack=int(per_pack), implementation=_IMPLEMENTATIONS[impl]
                    )
                    point = {
                        "fp32_bytes": fp32_bytes,
                        "elements": elements,
                        "bytes": nbytes,
                        "iters": iters,
                        "tensors": len(_pieces(elements, count)),
                    }
                    try:
                        seconds = time_allreduce(
                            strategy,
                            _pieces(elements, count),
                            dtype,
                            options,
                            iters,
                            spec["repeats"],
                        )
                        point.update(samples_s=seconds, time_s=median(seconds))
                    except (tf.errors.OpError, ValueError, TypeError) as e:  # same on every worker
                        point["unavailable"] = f"{type(e).__name__}: {str(e)[:200]}"
                    points.append(point)
                rows.append(
                    {
                        "implementation": impl,
                        "packing": packing,
                        "tensors": count,
                        "bytes_per_pack": per_pack,
                        "dtype": dtype_name,
                        "points": points,
                    }
                )
                report_progress(f"{impl}, {packing}, {dtype_name}: series {len(rows)}/{total}")
    return rows


def _recv_exactly(conn: socket.socket, buf: memoryview) -> None:
    got = 0
    while got < len(buf):
        n = conn.recv_into(buf[got:])
        if n == 0:
            raise ConnectionError("loopback peer closed")
        got += n


def loopback(spec: dict[str, Any], task_id: int) -> dict[str, list[dict[str, Any]]]:
    """Worker 0 receives, worker 1 sends the same sizes over TCP on 127.0.0.1.

    Worker 0 also copies them with numpy.
    """
    port = int(spec["socket_port"])
    sizes = [int(s) for s in spec["sizes"]]
    out: dict[str, list[dict[str, Any]]] = {"numpy_copy": [], "tcp_loopback": []}
    if task_id == 0:
        with socket.create_server(("127.0.0.1", port)) as server:
            conn, _ = server.accept()
            conn.setsockopt(
                socket.IPPROTO_TCP, socket.TCP_NODELAY, 1
            )  # no Nagle delay on the 1-byte "go"
            with conn:
                for size in sizes:
                    iters = iterations(size, spec)
                    buf = memoryview(bytearray(size))
                    samples = []
                    for _ in range(spec["repeats"]):
                        start = time.perf_counter()
                        conn.sendall(
                            b"g"
                        )  # the sender starts now: the time includes one round trip
                        for _ in range(iters):
                            _recv_exactly(conn, buf)
                        samples.append((time.perf_counter() - start) / iters)
                    out["tcp_loopback"].append(_rate(size, samples, iters))
        for size in sizes:
            iters = iterations(size, spec)
            src, dst = np.ones(size, np.uint8), np.empty(size, np.uint8)
            samples = []
            for _ in range(spec["repeats"]):
                start = time.perf_counter()
                for _ in range(iters):
                    np.copyto(dst, src)
                samples.append((time.perf_counter() - start) / iters)
            out["numpy_copy"].append(_rate(size, samples, iters))
    elif task_id == 1:
        deadline = time.time() + 60
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", port))
                break
            except ConnectionRefusedError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            for size in sizes:
                payload = bytes(size)
                for _ in range(spec["repeats"]):
                    _recv_exactly(conn, memoryview(bytearray(1)))
                    for _ in range(iterations(size, spec)):
                        conn.sendall(payload)
    return out


def _rate(size: int, samples: list[float], iters: int) -> dict[str, Any]:
    t = median(samples)
    return {
        "bytes": size,
        "time_s": t,
        "GBps": size / t / 1e9 if t > 0 else None,
        "iters": iters,
        "samples_s": samples,
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    strategy = tfdist.make_strategy("multi_worker")
    _, task_id = task()
    rows = sweep(strategy, spec)
    return {
        "num_workers": strategy.num_replicas_in_sync,
        "series": rows,
        "loopback": loopback(spec, task_id),
    }
