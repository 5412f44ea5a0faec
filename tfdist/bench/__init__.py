"""Side-by-side benchmarks, reported as ratios in JSON (and a PNG chart).

    python -m tfdist bench --output=bench_results/bench.json
    # real worker processes:
    python -m tfdist bench --benchmarks=scaling,allreduce --threads_per_worker=1

Start at ``names.py`` (every benchmark, where it lives and how it runs), then ``runner.py``
(`tfdist.bench.runner.run`, what ``tfdist bench`` calls). Nothing is imported here: the CLI
reads ``names.py`` before TensorFlow loads.

* ``names.py``: the one registry of benchmark names: module, in-process or launching.
* ``runner.py``: ``run``: the benchmarks named, in order; their results as JSON and charts.
* ``harness/``: what every benchmark shares: registration, timing, fits, reports, processes.
* ``in_process/``: the benchmarks run in this process (by default), one module each.
* ``scaling/``: weak scaling over worker processes (its parent, its worker, the sides).
* ``allreduce/``: all-reduce bandwidth across worker processes.
* ``stragglers/``: one slowed worker under MWMS and parameter-server training.
* ``balance/``: an uneven pair of workers, even split against balanced (and its plot).
* ``health/``: what the watchdog and the straggler report cost a step.
* ``time_to_accuracy/``: wall seconds to a validation accuracy (and its tasks).
* ``first_fit/``: a first fit on a fresh cluster against the steady ones.
* ``memory/``: what ZeRO-1/2 save per worker (and the demonstration under a memory cap).
* ``pipeline/``: pipeline stages on two devices against one (its own processes; the bubble).
* ``language_model/``: a small GPT: tokens/s of each way to train it, time to a bits per byte.
"""
