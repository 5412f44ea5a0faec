"""The one registry of ``tfdist bench``'s benchmarks: each name, where it lives, how it runs.

Pure Python with no imports from tfdist, so that the CLI checks ``--benchmarks`` and lists the
names in its help before TensorFlow loads (``tfdist.cli`` reads this module lazily). The runner
imports each benchmark's module from here, whose ``@common.register(name)`` defines it
(tests/test_cli_help.py: the names here are the registered ones).

To add a benchmark: write its module (an in-process one under ``in_process/``; one that starts
worker processes in a folder of its own, its ``parent.py`` and ``worker.py``) and add a line
to `BENCHMARKS`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of ``tfdist bench``.

    Attributes:
        name: The ``--benchmarks`` name and the key of its results in the JSON.
        module: The module whose ``@common.register(name)`` defines it.
        launches: It starts worker processes and takes minutes: it runs only when named.
        own_processes: It starts them itself, not through ``tfdist launch`` (so a ``preload``
            option does nothing for it).
    """

    name: str
    module: str
    launches: bool = False
    own_processes: bool = False


def _in_process(name: str) -> Benchmark:
    return Benchmark(name, f"tfdist.bench.in_process.{name}")


def _launching(name: str, *, own_processes: bool = False) -> Benchmark:
    return Benchmark(name, f"tfdist.bench.{name}.parent", True, own_processes)


#: Every benchmark: the in-process ones (run by default), then those that launch processes.
BENCHMARKS: tuple[Benchmark, ...] = (
    _in_process("trainer_vs_fit"),
    _in_process("mfu"),
    _in_process("accumulation"),
    _in_process("bf16_vs_fp32"),
    _in_process("backup"),
    _in_process("parameter_server"),
    _in_process("sparse_exchange"),
    _launching("scaling"),
    _launching("allreduce"),
    _launching("stragglers"),
    _launching("balance"),
    _launching("health"),
    _launching("time_to_accuracy"),
    _launching("first_fit"),
    _launching("memory"),
    _launching("pipeline", own_processes=True),
    _launching("language_model"),
)

#: The in-process benchmarks, sorted: ``tfdist bench`` runs these when none is named.
IN_PROCESS = tuple(sorted(b.name for b in BENCHMARKS if not b.launches))
#: The benchmarks that start worker processes, in the order above: run only when named.
LAUNCHING = tuple(b.name for b in BENCHMARKS if b.launches)
#: Of those, the ones that start their processes themselves, not through ``tfdist launch``.
OWN_PROCESSES = tuple(b.name for b in BENCHMARKS if b.own_processes)
#: Every module that registers a benchmark, in the order above.
MODULES = tuple(b.module for b in BENCHMARKS)


def all_names() -> tuple[str, ...]:
    """Every benchmark name, sorted (as ``--benchmarks``' refusal lists them)."""
    return tuple(sorted(b.name for b in BENCHMARKS))
