"""The data-parallel TensorFlow API's names that AWS's TF2 tutorial script (train.py here) does
not use, each used the way the library documents it, with a result only a real collective
gives: every rank starts from different values, and prints what it ends with.

- TF1 graph mode: dist.DistributedOptimizer (averaged gradients), dist.BroadcastGlobalVariablesHook
  (in a MonitoredTrainingSession), dist.broadcast_global_variables;
- Keras: dist_keras.DistributedOptimizer, dist_keras.callbacks.BroadcastGlobalVariablesCallback
  and MetricAverageCallback in model.fit.

Rank r (of n) starts every variable at r + 1; rank 0's value is 1. A step of SGD with learning
rate 1 on the loss (r + 1) * w moves w by the gradient averaged over the ranks, (n + 1) / 2.
"""

import json

import numpy as np
import tensorflow as tf

import smdistributed.dataparallel.tensorflow as dist
import smdistributed.dataparallel.tensorflow.keras as dist_keras

dist.init()
rank, size = dist.rank(), dist.size()
mean_gradient = (size + 1) / 2
seen: dict[str, object] = {}

# --- TF1 graph mode: DistributedOptimizer, BroadcastGlobalVariablesHook
with tf.Graph().as_default():
    w = tf.compat.v1.get_variable("w", initializer=tf.constant(float(rank + 1)))
    loss = float(rank + 1) * w
    optimizer = dist.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))
    step = optimizer.minimize(loss)
    hooks = [dist.BroadcastGlobalVariablesHook(0)]
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as session:
        seen["hook_broadcast"] = float(session.run(w))
        session.run(step)
        seen["optimizer_step"] = float(session.run(w))

# --- TF1 graph mode: broadcast_global_variables
with tf.Graph().as_default():
    v = tf.compat.v1.get_variable("v", initializer=tf.constant(float(rank + 1)))
    broadcast = dist.broadcast_global_variables(0)
    with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        seen["before_broadcast"] = float(session.run(v))
        session.run(broadcast)
        seen["global_broadcast"] = float(session.run(v))

# --- Keras: DistributedOptimizer and both callbacks
inputs = tf.keras.Input(shape=(1,))
outputs = tf.keras.layers.Dense(
    1, use_bias=False, kernel_initializer=tf.keras.initializers.Constant(float(rank + 1))
)(inputs)
model: tf.keras.Model = tf.keras.Model(inputs, outputs)
model.compile(
    optimizer=dist_keras.DistributedOptimizer(tf.keras.optimizers.SGD(learning_rate=1.0)),
    # y_pred's mean: with x = r + 1 its gradient in the kernel is r + 1, as above.
    loss=lambda y_true, y_pred: tf.reduce_mean(y_pred),
    # A metric that differs per rank until MetricAverageCallback averages it: x itself.
    metrics=[lambda y_true, y_pred: tf.reduce_mean(y_pred) * 0 + float(rank + 1)],
)
x = np.full((1, 1), float(rank + 1), dtype=np.float32)
history = model.fit(
    x,
    np.zeros((1, 1), dtype=np.float32),
    epochs=1,
    batch_size=1,
    verbose=0,
    callbacks=[
        dist_keras.callbacks.BroadcastGlobalVariablesCallback(0),
        dist_keras.callbacks.MetricAverageCallback(),
    ],
)
seen["keras_step"] = float(model.get_weights()[0][0][0])
metric = next(name for name in history.history if name != "loss")
seen["keras_metric"] = float(history.history[metric][-1])
seen["expected"] = {
    "broadcast": 1.0,
    "step": 1.0 - mean_gradient,
    "metric": mean_gradient,
}
print(f"SMDDP_OPTIMIZERS rank={rank} size={size} {json.dumps(seen, sort_keys=True)}", flush=True)
