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


def backend_name(env: Mapping[str, str]) -> str:
    """`multi_worker_mirrored` when the entry point asked for it, else `horovod`."""
    return MULTI_WORKER_MIRRORED if env.get(BACKEND_ENV) == MULTI_WORKER_MIRRORED else HOROVOD


def module_name(env: Mapping[str, str]) -> str:
    return "model.strategy" if backend_name(env) == MULTI_WORKER_MIRRORED else "model.collective"


def __getattr__(name: str) -> ModuleType:
    if name == "collective":
        return importlib.import_module(module_name(os.environ))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
