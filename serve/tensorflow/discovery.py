"""Which SavedModels a model archive holds, the way SageMaker's TF Serving container finds them.
Pure: a list of relative paths in, a Catalog out, or ModelError.

    /opt/ml/model/1/saved_model.pb            model "model" (the folder's own name), version 1
    /opt/ml/model/m1/7/saved_model.pb         model "m1", version 7
    /opt/ml/model/a/b/m2/0003/saved_model.pb  model "m2", version 3 (any depth)

A saved_model.pb counts only when its folder's name is all digits (a version); the model's name
is the folder above. Every version loads; the highest is the model's default. With several
models, SAGEMAKER_TFS_DEFAULT_MODEL_NAME names the default, else the first name in sorted order
(AWS's container takes the first the file system lists, which it calls unpredictable). One
exception kept from the built-in model's first releases: a saved_model.pb directly in the
model folder is that folder's model, version 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import PurePosixPath

from serve.errors import ModelError

SAVED_MODEL = "saved_model.pb"
DEFAULT_MODEL_VARIABLE = "SAGEMAKER_TFS_DEFAULT_MODEL_NAME"
# A model's own folder may hold labels for its outputs (the built-in classifier writes them).
LABELS_FILE = "classes.json"


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    name: str
    # The folder holding the version folders, relative to the model root ("" for the root).
    folder: str
    # version -> its folder relative to the model root, highest first.
    versions: tuple[tuple[int, str], ...]

    @property
    def latest(self) -> int:
        return self.versions[0][0]

    def version_folder(self, version: int) -> str | None:
        return next((folder for number, folder in self.versions if number == version), None)


@dataclasses.dataclass(frozen=True)
class Catalog:
    models: tuple[ModelEntry, ...]
    default: str

    def get(self, name: str) -> ModelEntry | None:
        return next((model for model in self.models if model.name == name), None)


def discover(
    saved_model_files: Iterable[str], root_name: str, default_model: str | None = None
) -> Catalog:
    """`saved_model_files`: every saved_model.pb under the model root, relative to it (POSIX);
    `default_model`: SAGEMAKER_TFS_DEFAULT_MODEL_NAME, if set."""
    found: dict[str, dict[int, str]] = {}
    folders: dict[str, str] = {}
    for raw in saved_model_files:
        path = PurePosixPath(raw)
        if path.name != SAVED_MODEL:
            continue
        version_dir = path.parent
        if str(version_dir) == ".":
            name, folder, version = root_name, "", 0
        elif version_dir.name.isdigit():
            model_dir = version_dir.parent
            folder = "" if str(model_dir) == "." else str(model_dir)
            name = model_dir.name if folder else root_name
            version = int(version_dir.name)
        else:
            continue
        if name in folders and folders[name] != folder:
            shown = [f"{f or '.'}/" for f in sorted((folders[name], folder))]
            raise ModelError(f"two models are named {name!r}: {shown[0]} and {shown[1]}")
        folders[name] = folder
        versions = found.setdefault(name, {})
        if version in versions:
            raise ModelError(
                f"model {name!r} has version {version} twice: {versions[version]} and {version_dir}"
            )
        versions[version] = "" if str(version_dir) == "." else str(version_dir)
    if not found:
        raise ModelError(
            "no SavedModel found (expected <model dir>/<version>/saved_model.pb, e.g. "
            "1/saved_model.pb, what training writes to /opt/ml/model/1)"
        )
    models = tuple(
        ModelEntry(
            name,
            folders[name],
            tuple(sorted(found[name].items(), reverse=True)),
        )
        for name in sorted(found)
    )
    wanted = (default_model or "").strip()
    if wanted and wanted not in found:
        raise ModelError(
            f"{DEFAULT_MODEL_VARIABLE}={wanted!r} names no model here "
            f"(found {', '.join(sorted(found))})"
        )
    return Catalog(models, wanted or models[0].name)
