"""``tfdist bench --benchmarks=memory``: what sharded optimizer state and gradients (ZeRO-1/2) save
per worker, and cost.

It starts worker processes and runs only when named. Start at ``parent.py``.

* ``parent.py``: the benchmark: a launch per mode (unsharded, ZeRO-1, ZeRO-2) and worker count.
* ``worker.py``: what each launched worker runs: the readings and when they are taken.
* ``cap.py``: the demonstration: under a memory cap, unsharded runs out, sharded trains.
"""
