"""``tfdist bench --benchmarks=allreduce``: all-reduce bandwidth across worker processes, in the
manner of nccl-tests.

It starts worker processes and runs only when named. Start at ``parent.py``.

* ``parent.py``: the benchmark: launches the workers, reports algbw and busbw per message size.
* ``worker.py``: what each launched worker runs: timed all-reduces of each size.
"""
