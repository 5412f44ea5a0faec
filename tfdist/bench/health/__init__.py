"""``tfdist bench --benchmarks=health``: what the progress watchdog and the straggler report cost a
synchronous step.

It starts worker processes and runs only when named. Start at ``parent.py``.

* ``parent.py``: the benchmark: launches the workers, reports each side's step time.
* ``worker.py``: what each launched worker runs: three Trainers (monitors off, on, on fast).
"""
