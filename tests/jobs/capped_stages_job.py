"""A training job too big for one process's memory cap, as one process or as 2 pipeline stages.

``python tests/jobs/capped_stages_job.py single`` trains it in this process;
``tfdist launch --workers=2 -- python tests/jobs/capped_stages_job.py stages`` as 2 stages, one
per process (`tfdist.stage_tasks`), in the 1F1B order. Run both under
``TF_CPU_ALLOCATOR_USE_BFC=true TF_CPU_BFC_MEM_LIMIT_IN_MB=CAP``. The model: 8 Dense layers of
1024 x 1024 with Adam, 8.4M parameters (96 MiB with Adam's two slots), on batches of 2048 rows:
one process holds every layer's activations of the whole batch (about 90 MiB more) at once;
each stage holds half the variables and slots and, with 16 micro-batches in the 1F1B order, the
activations of at most 2 micro-batches of its own layers.
"""

import sys

import tfdist

mode = sys.argv[1]
devices = tfdist.stage_tasks() if mode == "stages" else None  # worker 1 serves, never returns

import keras  # noqa: E402
import numpy as np  # noqa: E402

WIDTH, BATCH = 1024, 2048


def build():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((WIDTH,))
    h = inputs
    for name in "abcdefgh":
        h = keras.layers.Dense(WIDTH, activation="relu", name=name)(h)
    return keras.Model(inputs, keras.layers.Dense(10, name="out")(h))


pipeline = None
if mode == "stages":
    pipeline = tfdist.PipelineOptions(["d"], micro_batches=16, devices=devices, schedule="1f1b")
x = np.random.default_rng(0).normal(size=(BATCH, WIDTH)).astype("float32")
y = np.zeros(BATCH, "int32")
trainer = tfdist.Trainer(
    build,
    optimizer="adam",
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    pipeline=pipeline,
)
trainer.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)  # one update an epoch
print("trained", mode, int(trainer.model.optimizer.iterations.numpy()))
