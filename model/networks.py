"""The classifiers: uint8 images of image_size x image_size in, class probabilities out.

Scaling to [-1, 1] is the model's first layer, so callers feed raw pixels and the exported
model needs no client-side preprocessing. keras.applications models are built with
weights=None: nothing is downloaded, which also keeps the image usable without internet.
"""

from __future__ import annotations

import tensorflow as tf


def _small_cnn(inputs: tf.Tensor) -> tf.Tensor:
    """Three conv/batch-norm/pool stages: learns small, few-class data sets in a few epochs
    and trains fast on CPUs."""
    features = inputs
    for filters in (32, 64, 128):
        features = tf.keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(features)
        # Momentum 0.9, not Keras' 0.99: the moving statistics used at inference must settle
        # within the few hundred steps a small data set trains for.
        features = tf.keras.layers.BatchNormalization(momentum=0.9)(features)
        features = tf.keras.layers.ReLU()(features)
        features = tf.keras.layers.MaxPooling2D()(features)
    return tf.keras.layers.GlobalAveragePooling2D()(features)


def build_classifier(name: str, image_size: int, num_classes: int) -> tf.keras.Model:
    inputs = tf.keras.Input((image_size, image_size, 3), dtype=tf.uint8, name="image")
    scaled = tf.keras.layers.Rescaling(1 / 127.5, offset=-1.0)(inputs)
    shape = (image_size, image_size, 3)
    if name == "small_cnn":
        features = _small_cnn(scaled)
    elif name == "mobilenet_v2":
        backbone = tf.keras.applications.MobileNetV2(
            input_shape=shape, include_top=False, weights=None, pooling="avg"
        )
        features = backbone(scaled)
    elif name == "resnet50":
        backbone = tf.keras.applications.ResNet50(
            input_shape=shape, include_top=False, weights=None, pooling="avg"
        )
        features = backbone(scaled)
    else:
        raise ValueError(f"unknown model {name!r}")
    features = tf.keras.layers.Dropout(0.2)(features)
    # float32 output even under a mixed-precision policy: softmax in float16 saturates.
    outputs = tf.keras.layers.Dense(num_classes, activation="softmax", dtype="float32")(features)
    return tf.keras.Model(inputs, outputs, name=name)
