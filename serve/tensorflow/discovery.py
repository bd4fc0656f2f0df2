"""Which models a model archive holds: SavedModels, the way SageMaker's TF Serving container
finds them, and Keras `.keras` files. Pure: a list of relative paths in, a Catalog out, or
ModelError.

    /opt/ml/model/1/saved_model.pb            model "model" (the folder's own name), version 1
    /opt/ml/model/m1/7/saved_model.pb         model "m1", version 7
    /opt/ml/model/a/b/m2/0003/saved_model.pb  model "m2", version 3 (any depth)
    /opt/ml/model/model.keras                 model "model" (the file's stem), version 1
    /opt/ml/model/1/model.keras               model "model" (the folder's own name), version 1
    /opt/ml/model/m3/2/anything.keras         model "m3", version 2
    /opt/ml/model/sub/scores.keras            model "scores", version 1 (its folder: sub)

A saved_model.pb counts only when its folder's name is all digits (a version); the model's name
is the folder above. Every version loads; the highest is the model's default. With several
models, SAGEMAKER_TFS_DEFAULT_MODEL_NAME names the default, else the first name in sorted order
(AWS's container takes the first the file system lists, which it calls unpredictable). One
exception kept from the built-in model's first releases: a saved_model.pb directly in the
model folder is that folder's model, version 0.

A `.keras` file (Keras 3's one-file format, what `model.save("/opt/ml/model/model.keras")`
writes; Keras 2.13+ writes it too) is a version as a SavedModel's folder is: in a folder whose
name is all digits it is that version of the model named by the folder above; anywhere else it
is version 1 of the model named by its file's stem. Its entry's path is the file itself, not a
folder (is_keras tells them apart); serve converts it to a SavedModel before loading
(keras_export.py). A hidden file or one under a hidden folder (".name": macOS's `._model.keras`
copies in a tarball, editors' and notebooks' folders) is not a model. Two files for one
version, or a .keras file and a saved_model.pb for one version, stop the start naming both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import PurePosixPath

from serve.errors import ModelError

SAVED_MODEL = "saved_model.pb"
KERAS_SUFFIX = ".keras"
DEFAULT_MODEL_VARIABLE = "SAGEMAKER_TFS_DEFAULT_MODEL_NAME"
# A model's own folder may hold labels for its outputs (the built-in classifier writes them).
LABELS_FILE = "classes.json"


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    name: str
    # The folder holding the version folders, relative to the model root ("" for the root).
    folder: str
    # version -> its folder relative to the model root (a SavedModel) or its .keras file
    # (is_keras), highest first.
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


def is_keras(path: str) -> bool:
    """Whether a version's path (ModelEntry.versions) is a .keras file, not a SavedModel folder."""
    return path.endswith(KERAS_SUFFIX)


def _place(path: PurePosixPath, root_name: str) -> tuple[str, str, int, str] | None:
    """(model name, model folder, version, version path) of a saved_model.pb or .keras file
    relative to the root, or None for a file that is not a model version."""
    if path.name == SAVED_MODEL:
        version_dir = path.parent
        if str(version_dir) == ".":
            return root_name, "", 0, ""
        if not version_dir.name.isdigit():
            return None
        version_path = str(version_dir)
    elif path.suffix == KERAS_SUFFIX and path.stem:
        if any(part.startswith(".") for part in path.parts):
            return None
        version_dir = path.parent
        if not version_dir.name.isdigit():
            folder = "" if str(version_dir) == "." else str(version_dir)
            return path.stem, folder, 1, str(path)
        version_path = str(path)
    else:
        return None
    model_dir = version_dir.parent
    folder = "" if str(model_dir) == "." else str(model_dir)
    name = model_dir.name if folder else root_name
    return name, folder, int(version_dir.name), version_path


def _shown(version_path: str) -> str:
    """A version's path in a message: a SavedModel by its saved_model.pb."""
    if is_keras(version_path):
        return version_path
    return str(PurePosixPath(version_path) / SAVED_MODEL)


def discover(
    model_files: Iterable[str], root_name: str, default_model: str | None = None
) -> Catalog:
    """`model_files`: every saved_model.pb and .keras file under the model root, relative to
    it (POSIX); other paths are ignored. `default_model`: SAGEMAKER_TFS_DEFAULT_MODEL_NAME, if
    set."""
    found: dict[str, dict[int, str]] = {}
    folders: dict[str, str] = {}
    for raw in model_files:
        placed = _place(PurePosixPath(raw), root_name)
        if placed is None:
            continue
        name, folder, version, version_path = placed
        if name in folders and folders[name] != folder:
            shown = [f"{f or '.'}/" for f in sorted((folders[name], folder))]
            raise ModelError(f"two models are named {name!r}: {shown[0]} and {shown[1]}")
        folders[name] = folder
        versions = found.setdefault(name, {})
        if version in versions:
            first, second = sorted((_shown(versions[version]), _shown(version_path)))
            raise ModelError(f"model {name!r} has version {version} twice: {first} and {second}")
        versions[version] = version_path
    if not found:
        raise ModelError(
            "no SavedModel found (expected <model dir>/<version>/saved_model.pb, e.g. "
            "1/saved_model.pb, what training writes to /opt/ml/model/1, or a .keras file, e.g. "
            "model.keras)"
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
