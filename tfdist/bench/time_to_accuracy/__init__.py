"""``tfdist bench --benchmarks=time_to_accuracy``: wall seconds to a validation accuracy, 1 and 2
workers, two LR rules.

It starts worker processes and runs only when named. Start at ``parent.py``.

* ``parent.py``: the benchmark: launches each worker count and task, reports the times.
* ``worker.py``: what each launched task runs: train until the target accuracy.
* ``tasks.py``: the tasks it trains (digits, patterns): their models, data and goals.
* ``alone.py``: side ``alone``: worker 0 of the 2-worker launch by itself on one_device
  while worker 1 waits, and each 2-worker side's ratios over it in the same launch.
* ``trained.py``: the examples a local side trained on (a worker adapting to stragglers skips
  updates), each worker's inner steps, and the uneven pair's adapting / plain ratios.
"""
