"""tf_s3's import hook decides when tensorflow_io can be imported: not while tensorflow or keras
is half-imported (a script's `import keras` first imports tensorflow halfway through its own
import; tensorflow_io then failed on a circular import, and the process crashed at exit)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from tf_s3 import plugin_library, ready_to_load


def module(name: str, *, initializing: bool) -> types.ModuleType:
    """A module as importlib leaves it: its spec says whether its code is still running."""
    made = types.ModuleType(name)
    made.__spec__ = types.SimpleNamespace(name=name, _initializing=initializing)  # type: ignore[assignment]
    return made


@pytest.mark.parametrize(
    ("modules", "just_imported", "ready"),
    [
        # `import tensorflow`: its hook fires at the end of its own import.
        ({"tensorflow": True}, "tensorflow", True),
        # tensorflow importing keras inside its own import: keras's hook waits for tensorflow.
        ({"tensorflow": True, "keras": True}, "keras", False),
        # ... then tensorflow's hook, keras done.
        ({"tensorflow": True, "keras": False}, "tensorflow", True),
        # `import keras` first: keras imports tensorflow, whose hook sees keras half-imported.
        ({"keras": True, "tensorflow": True}, "tensorflow", False),
        # ... then keras's own hook, tensorflow done: now.
        ({"keras": True, "tensorflow": False}, "keras", True),
        # keras without tensorflow (no TensorFlow in the process): nothing to load.
        ({"keras": True}, "keras", False),
    ],
)
def test_tensorflow_io_waits_until_tensorflow_and_keras_have_run(modules, just_imported, ready):
    loaded = {name: module(name, initializing=flag) for name, flag in modules.items()}
    assert ready_to_load(loaded, just_imported) is ready


def test_a_module_without_a_spec_counts_as_imported():
    assert ready_to_load({"tensorflow": types.ModuleType("tensorflow")}, "keras") is True


def test_the_plugin_library_is_found_beside_the_package_without_importing_it():
    """The 2.21 line registers tensorflow-io's plugin library from the package's folder, found
    by find_spec (importing the package would settle tf.keras as Keras 3)."""
    origin = "/opt/venv/lib/python3.11/site-packages/tensorflow_io/__init__.py"
    assert plugin_library(origin) == Path(
        "/opt/venv/lib/python3.11/site-packages/tensorflow_io/python/ops/"
        "libtensorflow_io_plugins.so"
    )
