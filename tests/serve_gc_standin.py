"""The app factory test_serve_gc.py runs under uvicorn in its own process: serve's real app and
batcher around a stand-in classifier whose load leaves ~300k objects alive, as importing
TensorFlow and loading a SavedModel does (271k-284k measured, docs/serve.md).

SM_TEST_GC_NO_FREEZE=1 skips the freeze: how the test was shown to fail without it.

Every FULL_COLLECTION_EVERY-th model call also runs a full collection, timed like any other:
since /invocations skips Starlette (app.HotPaths) a request leaves too little behind for the
collector to start a full one within the test's 12,800 requests, and a run without one proves
nothing."""

from __future__ import annotations

import gc
import itertools
import os
from pathlib import Path

import numpy as np
from starlette.types import ASGIApp

from serve import app, heap
from serve.runner import Runner
from serve.settings import Settings
from serve.tensorflow.model import Model, Registry, Version
from serve.tensorflow.runner import Loaded, compose

HEAP_OBJECTS = 300_000
FULL_COLLECTION_EVERY = 100
CLASSES = ("dark", "light")


def _load(settings: Settings) -> Runner:
    # Lists stay tracked by the collector (tuples of atoms would be untracked).
    held = [[index] for index in range(HEAP_OBJECTS)]
    calls = itertools.count(1)

    def predict(images: np.ndarray) -> np.ndarray:
        assert held  # the model's objects live as long as the model
        if next(calls) % FULL_COLLECTION_EVERY == 0:
            gc.collect()
        light = images.reshape(len(images), -1).mean(axis=1) / 255
        return np.stack([1 - light, light], axis=1).astype(np.float32)

    model = Model("model", {1: Version(1, {})}, 1, CLASSES, predict)
    return compose(Loaded(Registry({"model": model}, "model")), settings)


def create_app() -> ASGIApp:
    if os.environ.get("SM_TEST_GC_NO_FREEZE") == "1":
        heap.freeze_heap = lambda collect=True: heap.gc.get_freeze_count()
    settings = Settings(model_dir=Path(os.environ["SM_SERVE_MODEL_DIR"]))
    return app.create_app(settings, loader=_load)
