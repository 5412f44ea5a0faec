"""``backup``: the time a step-exact backup costs, side by side with no backup.

Both sides are ``tfdist.Trainer`` on the same mirrored strategy (2 virtual CPU
devices), the same CNN from identical weights, the same in-memory data and
SGD; one has ``backup_dir`` with ``backup_freq=BACKUP_FREQ`` updates, the other
none. Each timed ``fit`` runs 64 updates, so the backed-up side writes 3
in-epoch backups plus one at the epoch end, then removes the backup (no
restore happens: each call starts clean).

* ``ratio``: examples/s over the steps (the in-epoch backups), with / without;
* ``ratio_whole_call``: the same over whole ``fit`` calls, the epoch-end save
  and the removal included;
* ``seconds_per_backup``: the extra time per backup taken.

The work a kill can lose is at most ``backup_freq`` updates (the fault tests
show it: a worker killed after update 22 resumes from 20 or 22).

    tfdist bench --benchmarks=backup
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import keras

from tfdist.bench import common, fits, timing

INPUT_SHAPE = (8, 8, 1)
NUM_CLASSES = 10
GLOBAL_BATCH_SIZE = 256
STEPS_PER_FIT = 64
BACKUP_FREQ = 16


@common.register("backup")
def backup(repeats: int, quick: bool) -> dict[str, Any]:
    """Trainer with backup_dir (every 16 updates) vs without, mirrored over 2 CPU devices, CNN."""
    import tfdist

    strategy = common.strategy("mirrored")
    global_batch_size = 32 if quick else GLOBAL_BATCH_SIZE
    steps = 8 if quick else STEPS_PER_FIT
    freq = 2 if quick else BACKUP_FREQ
    dataset = fits.make_dataset(
        INPUT_SHAPE, NUM_CLASSES, global_batch_size=global_batch_size, num_batches=8
    )

    def build() -> keras.Model:
        return tfdist.models.get("cnn", input_shape=INPUT_SHAPE, num_classes=NUM_CLASSES)

    builder = fits.seeded(build)
    workdir = tempfile.mkdtemp(prefix="tfdist-bench-backup-")
    try:
        options = {
            "with_backup": {"backup_dir": f"{workdir}/backup", "backup_freq": freq},
            "no_backup": {},
        }
        trainers = {
            name: tfdist.Trainer(
                builder,
                strategy=strategy,
                optimizer=keras.optimizers.SGD(0.01),
                loss=fits.logits_loss(),
                **kwargs,
            )
            for name, kwargs in options.items()
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
    rates = {name: samples.median(name) for name in sides}
    overheads = {name: timing.median(side.overheads) for name, side in sides.items()}
    examples = steps * global_batch_size
    whole = {name: examples / (examples / rates[name] + overheads[name]) for name in sides}
    in_epoch_backups = (steps - 1) // freq
    extra = examples / rates["with_backup"] - examples / rates["no_backup"]
    return {
        "with_backup_examples_per_s": rates["with_backup"],
        "no_backup_examples_per_s": rates["no_backup"],
        "ratio": timing.ratio(rates["with_backup"], rates["no_backup"]),
        "ratio_whole_call": timing.ratio(whole["with_backup"], whole["no_backup"]),
        "seconds_per_backup": extra / in_epoch_backups if in_epoch_backups else None,
        "max_updates_lost_per_kill": freq,
        "goal": ">= 0.9",
        "fit_overhead_s": overheads,
        "updates_per_call": {name: list(side.updates) for name, side in sides.items()},
        "others_cpu_max": samples.max_others_cpu(),
        "samples": samples.as_dict(),
        "config": {
            "strategy": "mirrored",
            "num_replicas": strategy.num_replicas_in_sync,
            "model": "cnn",
            "global_batch_size": global_batch_size,
            "updates_per_fit": steps,
            "backup_freq": freq,
        },
    }
