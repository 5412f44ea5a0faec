"""``tfdist bench --benchmarks=memory``: what sharded optimizer state, gradients and parameters
(ZeRO-1/2/3) save per worker, and cost, on an MLP and on a GPT.

It starts worker processes and runs only when named. Start at ``parent.py``.

* ``parent.py``: the benchmark: a launch per workload, mode (unsharded, ZeRO-1/2/3) and worker
  count.
* ``worker.py``: what each launched worker runs: the readings and when they are taken.
* ``cap.py``: the demonstrations: under a memory cap, unsharded runs out and ``"gradients"``
  trains; ``"gradients"`` runs out too and ``"parameters"`` trains.
"""
