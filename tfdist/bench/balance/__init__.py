"""``tfdist bench --benchmarks=balance``: an uneven pair (a noisy neighbour on one worker), even
split against balanced, on two workloads (the convnet's slow steps, the digits CNN's fast ones).

It starts worker processes and runs only when named. Start at ``parent.py``.

* ``parent.py``: the benchmark: launches each side, reports step times and shares.
* ``ab.py``: the A/B sides' figures: even and balanced fits alternated in one launch.
* ``worker.py``: what each launched task runs; the CPU hog that makes a noisy neighbour.
* ``plot.py``: its PNG: step time and each worker's share over time.
"""
