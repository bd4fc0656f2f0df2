"""Which distribution backend the built-in model runs on, from what the entry point says.

The entry point sets SM_HVD_BACKEND (smcommon/names.py) for tf.distribute's strategies;
without it (mpirun, or a container started by hand) the model runs on Horovod. Both modules
provide the same functions (model/collective.py documents them).

`from model.backend import collective` gives the chosen module; it is imported only then
(PEP 562 module __getattr__), so the pure choice below is testable without TensorFlow, and
nothing is decided before the process' environment is final.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from types import ModuleType

from smcommon.names import BACKEND_ENV, MULTI_WORKER_MIRRORED_BACKEND

HOROVOD = "horovod"
MULTI_WORKER_MIRRORED = MULTI_WORKER_MIRRORED_BACKEND
# TensorFlow's switch that makes tf.keras tf_keras (Keras 2) on TensorFlow >= 2.16.
LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"


def backend_name(env: Mapping[str, str]) -> str:
    """`multi_worker_mirrored` when the entry point asked for it, else `horovod`."""
    return MULTI_WORKER_MIRRORED if env.get(BACKEND_ENV) == MULTI_WORKER_MIRRORED else HOROVOD


def legacy_keras_setting(env: Mapping[str, str], *, tf_keras_installed: bool) -> str | None:
    """TF_USE_LEGACY_KERAS for the model's process (set before TensorFlow is imported), or None
    to leave the environment alone.

    Under MultiWorkerMirroredStrategy Keras 3's model.fit fails before its first step (Keras
    3.15's trainer reduces the (images, labels) batch across the workers as one value:
    "Attempt to convert a value (PerReplica...) to a Tensor"; AWS's TF 2.21 tests saw the same),
    where tf_keras' runs. So where tf_keras is installed (the 2.21 line) the model runs on it
    under that backend, whatever the job's environment says, since Keras 3 can only fail there.
    Horovod's backend runs on Keras 3 (or on what the job sets); on the 2.14 line (Keras 2, no
    tf_keras) nothing changes.
    """
    if backend_name(env) == MULTI_WORKER_MIRRORED and tf_keras_installed:
        return "1"
    return None


def module_name(env: Mapping[str, str]) -> str:
    return "model.strategy" if backend_name(env) == MULTI_WORKER_MIRRORED else "model.collective"


def __getattr__(name: str) -> ModuleType:
    if name == "collective":
        return importlib.import_module(module_name(os.environ))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
