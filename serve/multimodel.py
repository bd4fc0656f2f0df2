"""Multi-model endpoints (SAGEMAKER_MULTI_MODEL=true): the container starts with no model and
SageMaker loads and unloads models through SageMaker's contract for multi-model containers:

    POST   /models                 {"model_name": NAME, "url": FOLDER}   200, or
                                   409 already loaded (or loading), 404 no SavedModel at url,
                                   507 not enough memory, 500 the model does not load,
                                   400 a body without model_name and url
    GET    /models                 {"models": [{"modelName": NAME, "modelUrl": FOLDER}, ...]}
    GET    /models/NAME            {"modelName": NAME, "modelUrl": FOLDER, ...}   or 404
    DELETE /models/NAME            200, or 404
    POST   /models/NAME/invoke     the model's answer, or 404 "Model NAME is not loaded yet."

Each model is its own runner (its own batcher, its own code/inference.py, every version under
its folder), composed when it loads. A load (the folder's walk included) runs in a worker thread:
requests to the models already loaded, and /ping, keep being answered meanwhile. The heap is
frozen after each load and refrozen after each unload (heap.py). Messages and codes follow
AWS's TF Serving container (python_service.py) and SageMaker's contract (507 makes SageMaker
unload models).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio.to_thread

from serve import heap
from serve.errors import ServeError, one_line
from serve.runner import ModelInfo, Runner
from serve.tensorflow.discovery import KERAS_SUFFIX, SAVED_MODEL

log = logging.getLogger("serve")

MEMINFO = Path("/proc/meminfo")
CGROUP_MAX = Path("/sys/fs/cgroup/memory.max")
CGROUP_CURRENT = Path("/sys/fs/cgroup/memory.current")
# A loaded SavedModel takes about its size on disk again in memory, and TensorFlow's first call
# allocates more: ask for twice the folder's size.
MEMORY_PER_DISK_BYTE = 2

# (name, folder) -> the model's runner, loaded (called in a worker thread).
ModelLoader = Callable[[str, Path], Runner]


# --- pure -------------------------------------------------------------------------------------


def parse_load_request(body: bytes) -> tuple[str, str]:
    """POST /models' body -> (model_name, url); ServeError(400) naming what is missing."""
    try:
        document = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ServeError(400, f"load request: malformed JSON ({exc})") from None
    if not isinstance(document, dict):
        raise ServeError(400, 'load request must be {"model_name": ..., "url": ...}')
    name, url = document.get("model_name"), document.get("url")
    missing = [key for key, value in (("model_name", name), ("url", url)) if not value]
    if missing or not isinstance(name, str) or not isinstance(url, str):
        shown = ", ".join(missing) or "model_name, url"
        raise ServeError(400, f"load request: {shown} must be a non-empty string")
    if "/" in name:
        raise ServeError(400, f"load request: model_name {name!r} must not contain '/'")
    return name, url


def memory_refusal(available: int | None, needed: int, min_free: int) -> str | None:
    """Why a model of `needed` bytes must not load with `available` bytes free (keeping
    `min_free`), or None. Unknown availability never refuses."""
    if available is None or available - needed >= min_free:
        return None
    mib = 1024 * 1024
    return (
        f"{available // mib} MiB free, the model needs about {needed // mib} MiB and "
        f"{min_free // mib} MiB must stay free"
    )


def available_memory(
    meminfo: str, cgroup_max: str | None, cgroup_current: str | None
) -> int | None:
    """Free memory in bytes: the machine's MemAvailable, or less under a cgroup v2 limit."""
    available: int | None = None
    for line in meminfo.splitlines():
        key, _, value = line.partition(":")
        if key == "MemAvailable":
            available = int(value.split()[0]) * 1024
    limit = (cgroup_max or "").strip()
    if limit.isdigit() and (cgroup_current or "").strip().isdigit():
        left = int(limit) - int((cgroup_current or "0").strip())
        available = left if available is None else min(available, left)
    return available


# --- shell ------------------------------------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def free_memory() -> int | None:
    return available_memory(_read(MEMINFO) or "", _read(CGROUP_MAX), _read(CGROUP_CURRENT))


def folder_bytes(folder: Path) -> int:
    return sum(
        (Path(root) / name).stat().st_size
        for root, _dirs, names in os.walk(folder, followlinks=True)
        for name in names
    )


@dataclasses.dataclass(frozen=True)
class Entry:
    runner: Runner
    url: str


class ModelManager:
    """The loaded models of a multi-model endpoint, by name. Lives in one event loop: no lock
    is needed around the dict, and a load in progress holds its name in `loading`."""

    def __init__(
        self, loader: ModelLoader, min_free_bytes: int, pauses: heap.PauseWatch | None = None
    ) -> None:
        self._loader = loader
        self._pauses = pauses or heap.PauseWatch()
        self._min_free_bytes = min_free_bytes
        self.entries: dict[str, Entry] = {}
        self.loading: set[str] = set()

    def get(self, name: str) -> Entry:
        entry = self.entries.get(name)
        if entry is None:
            raise ServeError(404, f"Model {name} is not loaded yet.")
        return entry

    def describe(self, name: str) -> dict[str, Any]:
        entry = self.get(name)
        [info] = [m for m in entry.runner.models if m.name == name] or entry.runner.models[:1]
        return {"modelName": name, "modelUrl": entry.url, "versions": list(info.versions)}

    def listing(self) -> dict[str, Any]:
        return {
            "models": [
                {"modelName": name, "modelUrl": entry.url}
                for name, entry in sorted(self.entries.items())
            ]
        }

    def infos(self) -> list[ModelInfo]:
        return [
            dataclasses.replace(entry.runner.models[0], name=name)
            for name, entry in sorted(self.entries.items())
        ]

    def _check_and_load(self, name: str, url: str) -> Runner:
        """In a worker thread: the folder walked (a large model's is slow to walk), its memory
        weighed, the model loaded, the heap frozen (heap.py). ServeError for what SageMaker
        must hear."""
        folder = Path(url)
        if not folder.is_dir() or not any(
            (Path(root).name.isdigit() and SAVED_MODEL in names)
            or any(n.endswith(KERAS_SUFFIX) and not n.startswith(".") for n in names)
            for root, _dirs, names in os.walk(folder, followlinks=True)
        ):
            raise ServeError(404, f"Could not find valid base path {url} for servable {name}")
        refusal = memory_refusal(
            free_memory(), MEMORY_PER_DISK_BYTE * folder_bytes(folder), self._min_free_bytes
        )
        if refusal is not None:
            raise ServeError(507, f"Memory exhausted: cannot load model {name}: {refusal}")
        try:
            runner = self._loader(name, folder)
        except ServeError:
            raise
        except Exception as exc:  # noqa: BLE001  (TensorFlow and user code raise many types)
            raise ServeError(500, f"cannot load model {name} from {url}: {one_line(exc)}") from None
        # No collection first: it would walk the heap holding the GIL, stopping /ping and the
        # other models; an unload collects (heap.py).
        frozen = self._pauses.freeze(collect=False)
        log.info("gc: %d objects frozen after loading %s", frozen, name)
        return runner

    async def load(self, name: str, url: str) -> str:
        if name in self.entries or name in self.loading:
            raise ServeError(409, f"Model {name} is already loaded.")
        # Everything that touches the disk runs off the event loop: /ping and the models
        # already loaded keep answering while a large model is walked and loaded.
        self.loading.add(name)
        started = time.monotonic()
        try:
            runner = await anyio.to_thread.run_sync(self._check_and_load, name, url)
        finally:
            self.loading.discard(name)
        runner.start()
        self.entries[name] = Entry(runner, url)
        versions = ", ".join(str(v) for v in runner.models[0].versions)
        log.info(
            "model %s loaded from %s in %.1f s (version%s %s; %s)",
            name,
            url,
            time.monotonic() - started,
            "s" if len(runner.models[0].versions) > 1 else "",
            versions,
            runner.summary,
        )
        return f"Successfully loaded model {name}"

    async def unload(self, name: str) -> str:
        entry = self.get(name)
        del self.entries[name]
        await entry.runner.stop()
        del entry
        # The unloaded model's cycles were frozen with it: unfreeze, collect, freeze again.
        frozen = await anyio.to_thread.run_sync(self._pauses.refreeze)
        log.info("model %s unloaded; gc: %d objects frozen", name, frozen)
        return f"Successfully unloaded model {name}."

    async def stop(self) -> None:
        for name in list(self.entries):
            await self.entries.pop(name).runner.stop()
