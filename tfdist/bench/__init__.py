"""Side-by-side benchmarks, reported as ratios in JSON (and a PNG chart).

    python -m tfdist bench --output=bench_results/bench.json
    # real worker processes:
    python -m tfdist bench --benchmarks=scaling,allreduce --threads_per_worker=1

See `tfdist.bench.runner.run`; benchmarks register in ``tfdist.bench.common``.
"""
