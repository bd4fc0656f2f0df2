"""s3:// paths in TensorFlow for unchanged scripts.

TensorFlow 2.6+ ships no S3 file system: tensorflow-io's plugin library provides it (with az,
hdfs, http(s) and oss), registered when a program runs `import tensorflow_io`. Scripts written
for AWS's containers never do (their TensorFlow builds have S3 compiled in), so this image runs
that import for them: `sm-horovod-tf-s3.pth` in site-packages calls `install()` at interpreter
start, which only registers a hook (wrapt's post-import hook, no TensorFlow import); when a
process imports tensorflow (a rank, a tf.distribute task, TensorBoard, `serve`), the hook
imports tensorflow_io. A script's own `import tensorflow_io` then finds it imported (a second
registration of the plugin would fail with AlreadyExistsError).

On the TensorFlow 2.21 line the package is tensorflow-io 0.37.1 (its last release, built for TF
2.16) without its op libraries, and the hook registers its file system plugin library without
importing the package: the package's import defines Keras layers, which would settle `tf.keras`
as Keras 3 before a script (or `import smdistributed.dataparallel.tensorflow`) can ask for
tf_keras with TF_USE_LEGACY_KERAS=1. The plugin library loads on 2.21 once the shim library
that SM_HVD_TF_IO_SHIM names (docker/tf-io-shim/tsl_shim.cc says why) has supplied, with its
symbols global, the TensorFlow-internal symbols that 2.21 no longer exports. A script's own
`import tensorflow_io` then finds the plugins registered (docker/tf-io-patches/ lets it;
docs/tf-lines.md).

Settings are the plugin's: credentials from the AWS SDK's default chain (AWS_ACCESS_KEY_ID...,
the container credentials endpoint, instance metadata), S3_ENDPOINT, S3_VERIFY_SSL, AWS_REGION /
AWS_DEFAULT_REGION, AWS_LOG_LEVEL. SM_HVD_TF_S3=0 turns the hook off.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

DISABLE_ENV = "SM_HVD_TF_S3"
# The 2.21 images set it: the shim library's path (Dockerfile).
SHIM_ENV = "SM_HVD_TF_IO_SHIM"
PLUGIN_LIBRARY = "libtensorflow_io_plugins.so"
# tensorflow_io imports Keras: loaded while either of these is half-imported, it fails on a
# circular import. Whichever of them finishes importing last loads it.
_WAIT_FOR = ("tensorflow", "keras")


def install() -> None:
    """Run once per interpreter (from the .pth file): cheap, never imports TensorFlow."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return
    import wrapt  # noqa: PLC0415 (only when enabled; TensorFlow depends on it)

    shim = os.environ.get(SHIM_ENV)
    loader = _PluginLoader(Path(shim) if shim else None)
    for name in _WAIT_FOR:
        wrapt.register_post_import_hook(loader.on_import, name)


def ready_to_load(modules: Mapping[str, object], just_imported: str) -> bool:
    """Whether tensorflow_io can be imported now that `just_imported` ran its code: tensorflow
    is imported, and neither it nor keras is still running its own import (a script's
    `import keras` imports tensorflow halfway through, and tensorflow's hook then sees keras
    half-imported). The hook runs inside the import of `just_imported`, which importlib still
    marks as initializing: its code has run."""
    if "tensorflow" not in modules:
        return False
    return not any(_initializing(modules.get(name)) for name in _WAIT_FOR if name != just_imported)


def _initializing(module: object) -> bool:
    """True while the module's own code runs: importlib marks its spec so, and that is what
    its "partially initialized module" error reads."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


class _PluginLoader:
    """Loads the file system plugins once per process, at the first hook that finds TensorFlow
    ready: `import tensorflow_io`, or, given the shim library (the 2.21 line), the package's
    plugin library alone after the shim."""

    def __init__(self, shim: Path | None) -> None:
        self.tried = False
        self.shim = shim

    def on_import(self, module: ModuleType) -> None:
        if self.tried or not ready_to_load(sys.modules, module.__name__):
            return
        self.tried = True
        # First: a plugin library that registered before a failure below still crashes at exit.
        atexit.register(exit_before_static_destructors)
        try:
            if self.shim is None:
                import tensorflow_io  # noqa: F401, PLC0415 (registers the file system plugins)
            else:
                register_plugin_library(self.shim)
        except Exception as error:  # noqa: BLE001 (an import of TensorFlow must never fail here)
            print(
                f"sm-horovod: tensorflow_io not loaded, s3:// paths are unavailable: {error}",
                file=sys.stderr,
            )


def plugin_library(package_origin: str) -> Path:
    """tensorflow-io's file system plugin library, from its package's __init__.py."""
    return Path(package_origin).parent / "python" / "ops" / PLUGIN_LIBRARY


def register_plugin_library(shim: Path) -> None:
    """tensorflow-io's plugin library, registered with TensorFlow once the shim is loaded with
    its symbols global: the plugin's undefined tsl:: symbols bind to the first global
    definition, which is the shim's (TensorFlow 2.21 exports none). Found without importing the
    package (find_spec runs none of its code). Once per process: TensorFlow refuses a second
    registration ("File system for az already registered"), and the interpreter in the image
    runs the .pth hook's install() twice (two loaders, seen on both lines)."""
    import tensorflow as tf  # noqa: PLC0415 (imported already: the hook runs after it)

    if "s3" in tf.io.gfile.get_registered_schemes():
        return
    spec = importlib.util.find_spec("tensorflow_io")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("No module named 'tensorflow_io'")
    ctypes.CDLL(str(shim), mode=ctypes.RTLD_GLOBAL)
    tf.experimental.register_filesystem_plugin(str(plugin_library(spec.origin)))


def exit_before_static_destructors() -> None:
    """tensorflow-io 0.35 (the release for TensorFlow 2.14) aborts a process that used S3 in a
    C++ static destructor at exit: "pure virtual method called", exit code 134 instead of the
    program's (https://github.com/tensorflow/io/issues/1912; fixed upstream in
    https://github.com/tensorflow/io/pull/2120, in no release). Registered with atexit, this
    runs once Python's own exit work is done and makes libc's exit(status) run, before those
    destructors, `fcloseall()` (flushes C stdio) then `_exit(status)`: the process ends with
    the program's own status. on_exit handlers run last-registered first and get the status as
    their first argument, which is _exit's only one."""
    libc = ctypes.CDLL(None)
    libc.on_exit(ctypes.cast(libc._exit, ctypes.c_void_p), None)
    libc.on_exit(ctypes.cast(libc.fcloseall, ctypes.c_void_p), None)
