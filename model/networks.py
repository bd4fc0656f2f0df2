"""The classifiers: uint8 images of image_size x image_size in, class probabilities out.

Input scaling is the model's first layer, so callers feed raw pixels and the exported model
needs no client-side preprocessing. keras.applications models are built with weights=None,
or with a weights file the job was given (the `pretrained` channel): nothing is downloaded,
which also keeps the image usable without internet.
"""

from __future__ import annotations

import math
from pathlib import Path

import tensorflow as tf

# The small CNN pools down to about this size before global pooling (see _stages).
_FINAL_FEATURE_SIZE = 4
_MIN_STAGES = 3
_FILTERS = (32, 64, 128, 256)


def small_cnn_stages(image_size: int) -> int:
    """Conv/pool stages for an image side: enough halvings to reach ~4x4.

    Measured on the digits (docs/model.md): with a fixed 3 stages, a 64x64 input ends in 8x8
    features whose receptive field (22 px) covers a third of the image, and the global
    average then pools local strokes: 0.972 train and 0.967 test accuracy. 4 stages at 64
    (receptive field 46 px): 1.000 and 0.992. So the depth follows the image size.
    """
    return max(_MIN_STAGES, int(math.log2(image_size / _FINAL_FEATURE_SIZE)))


def _small_cnn(inputs: tf.Tensor, image_size: int) -> tf.Tensor:
    """Conv/batch-norm/pool stages: learns small, few-class data sets in a few epochs and
    trains fast on CPUs."""
    features = inputs
    for stage in range(small_cnn_stages(image_size)):
        filters = _FILTERS[min(stage, len(_FILTERS) - 1)]
        features = tf.keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(features)
        # Momentum 0.9, not Keras' 0.99: the moving statistics used at inference must settle
        # within the few hundred steps a small data set trains for.
        features = tf.keras.layers.BatchNormalization(momentum=0.9)(features)
        features = tf.keras.layers.ReLU()(features)
        features = tf.keras.layers.MaxPooling2D()(features)
    return tf.keras.layers.GlobalAveragePooling2D()(features)


def build_classifier(
    name: str, image_size: int, num_classes: int, weights: Path | None = None
) -> tf.keras.Model:
    """`weights`: a Keras weights file for the keras.applications backbone (no top)."""
    inputs = tf.keras.Input((image_size, image_size, 3), dtype=tf.uint8, name="image")
    shape = (image_size, image_size, 3)
    if name == "small_cnn":
        if weights is not None:
            raise ValueError("pretrained weights are for mobilenet_v2 and resnet50")
        scaled = tf.keras.layers.Rescaling(1 / 127.5, offset=-1.0)(inputs)
        features = _small_cnn(scaled, image_size)
    elif name == "mobilenet_v2":
        # MobileNetV2's own preprocessing: [-1, 1].
        scaled = tf.keras.layers.Rescaling(1 / 127.5, offset=-1.0)(inputs)
        backbone = tf.keras.applications.MobileNetV2(
            input_shape=shape, include_top=False, weights=None, pooling="avg"
        )
        if weights is not None:
            backbone.load_weights(str(weights))
        features = backbone(scaled)
    elif name == "resnet50":
        # ResNet50's own preprocessing (BGR, ImageNet means), which its weights expect, on
        # float pixels. A layer casts them: Keras 3 takes no TensorFlow op (tf.cast) on a
        # functional model's symbolic inputs.
        pixels = tf.keras.layers.Rescaling(1.0, dtype="float32")(inputs)
        scaled = tf.keras.applications.resnet50.preprocess_input(pixels)
        backbone = tf.keras.applications.ResNet50(
            input_shape=shape, include_top=False, weights=None, pooling="avg"
        )
        if weights is not None:
            backbone.load_weights(str(weights))
        features = backbone(scaled)
    else:
        raise ValueError(f"unknown model {name!r}")
    features = tf.keras.layers.Dropout(0.2)(features)
    # float32 output even under a mixed-precision policy: softmax in float16 saturates.
    outputs = tf.keras.layers.Dense(num_classes, activation="softmax", dtype="float32")(features)
    return tf.keras.Model(inputs, outputs, name=name)
