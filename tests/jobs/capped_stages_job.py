"""A model too big for one process's memory cap, as one process or as 2 pipeline stages.

``python tests/jobs/capped_stages_job.py single`` trains it in this process;
``tfdist launch --workers=2 -- python tests/jobs/capped_stages_job.py stages`` as 2 stages, one
per process (`tfdist.stage_tasks`), in the 1F1B order. Run both under
``TF_CPU_ALLOCATOR_USE_BFC=true TF_CPU_BFC_MEM_LIMIT_IN_MB=CAP``. The model: 4 Dense layers of
2048 x 2048 with Adam, 16.8M parameters (201 MiB with Adam's two slots); each stage holds half.
"""

import gc
import sys

import tfdist

mode = sys.argv[1]
devices = tfdist.stage_tasks() if mode == "stages" else None  # worker 1 serves, never returns

import keras  # noqa: E402
import numpy as np  # noqa: E402


def build():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((2048,))
    h = inputs
    for name in "abcd":
        h = keras.layers.Dense(2048, activation="relu", name=name)(h)
    return keras.Model(inputs, keras.layers.Dense(10, name="out")(h))


pipeline = None
if mode == "stages":
    pipeline = tfdist.PipelineOptions(["b"], micro_batches=4, devices=devices, schedule="1f1b")
x = np.random.default_rng(0).normal(size=(256, 2048)).astype("float32")
y = np.zeros(256, "int32")
trainer = tfdist.Trainer(
    build,
    optimizer="adam",
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    pipeline=pipeline,
)
# Eager tensors freed by Python's garbage collector (the model's build, Adam's slots) stay in
# the capped allocator until a collection runs, whose timing moves with any import: free them
# before the step, so the peak measured is the step's own.
gc.collect()
trainer.fit(x, y, batch_size=64, epochs=1, verbose=0)
print("trained", mode, int(trainer.model.optimizer.iterations.numpy()))
