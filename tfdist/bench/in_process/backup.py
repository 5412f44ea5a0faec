"""``backup``: the time step-exact backups cost, asynchronous and synchronous, vs no backup.

Three sides, all ``tfdist.Trainer`` on the same mirrored strategy (2 virtual
CPU devices), the same CNN from identical weights, the same in-memory data and
SGD: ``asynchronous`` has ``BackupOptions(dir, freq=BACKUP_FREQ)`` (the
default: written and committed in the background), ``synchronous`` the same
with ``asynchronous=False`` (each save returns once committed), and
``no_backup`` none. Each timed ``fit`` runs 64 updates, so a backed-up side
writes 3 in-epoch backups plus one at the epoch end, then removes the backup
(no restore happens: each call starts clean).

``--slow_fsync_ms=MS`` simulates a slow disk: every fsync of a commit (the
checkpoint files, ``state.json``, the directory: 5 per backup) first sleeps
``MS`` milliseconds (``backup_files.SLOW_FSYNC_ENV``, a bench and test hook).

* ``ratio``: examples/s over the steps (the in-epoch backups), asynchronous /
  none, of the medians; ``synchronous_ratio`` the same for synchronous saves;
* ``paired_ratio``, ``synchronous_paired_ratio``: the median of the ratios
  within each round (the sides ran back to back), which cancels slow drifts;
* ``ratio_whole_call``, ``synchronous_ratio_whole_call``: the same over whole
  ``fit`` calls, the epoch-end save, the wait for its commit and the removal
  included;
* ``seconds_per_backup``: the extra time per in-epoch backup, per side.

The work a kill can lose is at most ``backup_freq`` updates with synchronous
saves (the fault tests show it: a worker killed after update 22 resumes from
20 or 22), and ``2 * backup_freq`` with asynchronous ones (a kill while the
newest backup is still being committed resumes from the one before).

    tfdist bench --benchmarks=backup
    tfdist bench --benchmarks=backup --slow_fsync_ms=30
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import keras

from tfdist.bench.harness import common, fits, timing
from tfdist.config import invalid_argument
from tfdist.training.backup.files import SLOW_FSYNC_ENV

STEPS_PER_FIT = 64
BACKUP_FREQ = 16
#: The sides with a backup: BackupOptions(asynchronous=...) of each.
BACKED_UP = {"asynchronous": True, "synchronous": False}


def _slow_fsync_ms() -> float:
    value = common.options().get("slow_fsync_ms", 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6:
        raise invalid_argument(
            "slow_fsync_ms", value, "a number of milliseconds >= 0 (0: no simulated slow disk)"
        )
    return float(value)


@contextlib.contextmanager
def _slow_disk(milliseconds: float) -> Iterator[None]:
    """Every fsync of a backup commit sleeps ``milliseconds`` first, inside the block."""
    before = os.environ.get(SLOW_FSYNC_ENV)
    os.environ[SLOW_FSYNC_ENV] = str(milliseconds)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SLOW_FSYNC_ENV, None)
        else:
            os.environ[SLOW_FSYNC_ENV] = before


@common.register("backup")
def backup(repeats: int, quick: bool) -> dict[str, Any]:
    """Trainer with async / sync backups every 16 updates vs none, mirrored over 2 CPU devices."""
    import tfdist

    slow_fsync_ms = _slow_fsync_ms()
    strategy = common.strategy("mirrored")
    run = fits.cnn_run(quick, STEPS_PER_FIT)
    global_batch_size, steps, dataset = run.global_batch_size, run.steps, run.dataset
    freq = 2 if quick else BACKUP_FREQ
    workdir = tempfile.mkdtemp(prefix="tfdist-bench-backup-")
    options = {
        name: tfdist.BackupOptions(f"{workdir}/{name}", freq=freq, asynchronous=asynchronous)
        for name, asynchronous in BACKED_UP.items()
    }
    try:
        with _slow_disk(slow_fsync_ms):
            trainers = {
                name: tfdist.Trainer(
                    run.builder,
                    strategy=strategy,
                    optimizer=keras.optimizers.SGD(fits.CNN_LEARNING_RATE),
                    loss=fits.logits_loss(),
                    backup=options.get(name),
                )
                for name in (*BACKED_UP, "no_backup")
            }
            sides = {
                name: fits.trainer_side(
                    trainer, dataset, global_batch_size=global_batch_size, steps=steps
                )
                for name, trainer in trainers.items()
            }
            samples = timing.alternate(sides, repeats)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    config = {
        **run.config(strategy),
        "updates_per_fit": steps,
        "backup_freq": freq,
        "slow_fsync_ms": slow_fsync_ms,
    }
    return {**_summary(samples, sides, config), "samples": samples.as_dict(), "config": config}


def _summary(
    samples: timing.Samples, sides: dict[str, fits.FitThroughput], config: dict[str, Any]
) -> dict[str, Any]:
    """The medians, ratios vs ``no_backup`` and seconds per backup of each side."""
    steps, freq = config["updates_per_fit"], config["backup_freq"]
    rates = {name: samples.median(name) for name in sides}
    overheads = {name: timing.median(side.overheads) for name, side in sides.items()}
    examples = steps * config["global_batch_size"]
    whole = {name: examples / (examples / rates[name] + overheads[name]) for name in sides}
    in_epoch_backups = (steps - 1) // freq
    out: dict[str, Any] = {f"{name}_examples_per_s": rates[name] for name in sides}
    for name in BACKED_UP:
        prefix = "" if name == "asynchronous" else f"{name}_"
        out[f"{prefix}ratio"] = timing.ratio(rates[name], rates["no_backup"])
        # Within each round the sides ran back to back: their ratio cancels slow drifts.
        paired = [a / b for a, b in zip(samples.values[name], samples.values["no_backup"]) if b > 0]
        out[f"{prefix}paired_ratio"] = timing.median(paired)
        out[f"{prefix}ratio_whole_call"] = timing.ratio(whole[name], whole["no_backup"])
    out["seconds_per_backup"] = {
        name: (examples / rates[name] - examples / rates["no_backup"]) / in_epoch_backups
        if in_epoch_backups
        else None
        for name in BACKED_UP
    }
    out.update(
        {
            # A kill before the newest backup's commit falls back to the one before it.
            "max_updates_lost_per_kill": {"asynchronous": 2 * freq, "synchronous": freq},
            "goal": ">= 0.98",
            "fit_overhead_s": overheads,
            "updates_per_call": {name: list(side.updates) for name, side in sides.items()},
            "others_cpu_max": samples.max_others_cpu(),
        }
    )
    return out
