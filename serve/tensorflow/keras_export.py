"""Keras `.keras` files as SavedModels, so that serve loads them the way it loads any SavedModel
(model.py: a session per version, TF Serving's signatures and REST rules).

serve's main process never imports TensorFlow (the workers do, after they start: model.py):
TensorFlow's threads do not survive a fork, and a parent's TensorFlow would hold seconds of
import and its memory for the server's whole life, serving nothing. Loading a .keras file needs
Keras and TensorFlow, so each file is converted once, in a child process of its own (by main.py
before the workers start; by a multi-model worker at a load):

    python -m serve.tensorflow.keras_export SRC DST

which loads SRC with the Keras that wrote it, exports a SavedModel to a folder beside DST and
renames that folder to DST (atomic: a worker sees a whole SavedModel or none). DST is a folder
of serve's own (export_folder: under SM_SERVE_KERAS_DIR, a temporary folder main.py makes and
removes; never inside /opt/ml/model, which may be read-only), named by the source's path, size
and modification time, so that a worker finds its parent's export and converts nothing again.

Which Keras (choose_keras): a file saved with Keras 3 (metadata.json's keras_version) loads
with Keras 3 (`keras.saving.load_model`, then `model.export`: a `serve` endpoint and a
`serving_default` signature, inputs named as the model's Input layers, outputs output_0, ...);
one saved with Keras 2 (tf.keras 2.13+ writes .keras too) with Keras 2 (the tf_keras package
where TF 2.16+ installs it, else the keras package of TF 2.15 and older: `load_model`, then
`tf.saved_model.save`: serving_default, inputs and outputs named as the model's layers). Both
load with compile=False: serving needs no optimizer, loss or metric (a custom loss need not be
registered). A file that cannot load (custom layers that are not registered, a Keras 3 file on
the TF 2.14 line) stops the start with one line naming the file and the cause, the child's
last error line (ERROR_PREFIX).

Pure parts first (choose_keras, export_folder, export_env, error_cause, keras_cause,
parse_args), read_keras_file (the zip alone, no TensorFlow: the parent refuses garbage without a
child), then the child (convert, main), then the parent's shell (run_export, export_archive).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serve.errors import ONE_LINE_MAX, ModelError, one_line
from serve.tensorflow.discovery import SAVED_MODEL

if TYPE_CHECKING:
    from serve.tensorflow.model import Archive

log = logging.getLogger("serve")

# Set by main.py for its workers: the folder the exports go to (and it removes at exit).
KERAS_DIR_ENV = "SM_SERVE_KERAS_DIR"
# One file's conversion: a TensorFlow import (seconds), the load and the export (a 1 GB model
# reads and writes its weights twice). Beyond this the child hangs, not works.
EXPORT_TIMEOUT_S = 600.0
# The child's own failure: one line on stderr starting with this, the cause after it.
ERROR_PREFIX = "keras_export: error: "
# The child's success: one line on stdout starting with this (which Keras converted it).
DONE_PREFIX = "keras_export: done: "
# In a .keras file (a zip archive): the model's configuration and who saved it.
CONFIG_MEMBER = "config.json"
METADATA_MEMBER = "metadata.json"
EXIT_USAGE = 2
USAGE = "usage: python -m serve.tensorflow.keras_export SRC.keras DST_FOLDER"


class Keras(enum.Enum):
    """The Keras a file loads with."""

    # Keras 3 (the keras package, 3.x): keras.saving.load_model, model.export.
    KERAS3 = "keras 3"
    # Keras 2 as the tf_keras package (TF 2.16+, TF_USE_LEGACY_KERAS's Keras).
    TF_KERAS = "tf_keras"
    # Keras 2 as the keras package (TF 2.15 and older: what tf.keras is there).
    KERAS2 = "keras 2"


@dataclasses.dataclass(frozen=True)
class KerasFile:
    path: Path
    # metadata.json's keras_version ("3.15.1", "2.14.0"); None where the file does not say.
    saved_with: str | None


def major(version: str | None) -> int | None:
    """'3.15.1' -> 3; None or a version without a leading number -> None."""
    head = (version or "").split(".", 1)[0]
    return int(head) if head.isdigit() else None


def choose_keras(saved_with: str | None, keras_version: str | None, tf_keras: bool) -> Keras:
    """The Keras to load a file with: the major version that saved it, where installed.
    `keras_version`: the installed keras package's version (None: not installed); `tf_keras`:
    whether the tf_keras package is installed. A file that does not say who saved it loads with
    what `import keras` gives. ModelError (the cause alone) where nothing installed fits."""
    installed = major(keras_version)
    wanted = major(saved_with)
    if wanted is None:
        wanted = installed or (2 if tf_keras else None)
    if wanted is not None and wanted >= 3:
        if installed is not None and installed >= 3:
            return Keras.KERAS3
        have = f"Keras {keras_version}" if keras_version else "no Keras"
        raise ModelError(
            f"saved with Keras {saved_with or '3'}, and this image has {have}: serve it on the "
            "TensorFlow 2.21 line, or save it with tf.keras 2 (a SavedModel or .keras)"
        )
    if wanted == 2:
        if tf_keras:
            return Keras.TF_KERAS
        if installed == 2:
            return Keras.KERAS2
        if installed is not None and installed >= 3:
            # Keras 3 reads most Keras 2 .keras files (its legacy config conversion).
            return Keras.KERAS3
    raise ModelError(f"saved with Keras {saved_with or '(unknown)'}, and no Keras is installed")


def export_folder(keras_dir: Path, source: Path, size: int, mtime_ns: int) -> Path:
    """Where a .keras file's SavedModel goes: named by the file's stem (for people) and a digest
    of its absolute path, size and modification time (two models' model.keras never share one;
    a changed file is converted again; a worker finds its parent's export)."""
    digest = hashlib.sha256(f"{source}\0{size}\0{mtime_ns}".encode()).hexdigest()[:16]
    return keras_dir / f"{source.stem}-{digest}"


def export_argv(python: str, source: Path, dest: Path) -> list[str]:
    return [python, "-m", "serve.tensorflow.keras_export", str(source), str(dest)]


def export_env(env: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: the parent's, with the TensorFlow backend for Keras 3 (export
    needs it, whatever KERAS_BACKEND the user set for training), no GPU (the export places
    nothing on one and the workers' TensorFlow loads it on whatever device they have; a GPU
    would only cost the child CUDA's start-up and memory the workers need) and TensorFlow's C++
    log quiet unless the user asked for it (its last line would hide the cause)."""
    child = dict(env)
    child["KERAS_BACKEND"] = "tensorflow"
    child["CUDA_VISIBLE_DEVICES"] = "-1"
    child.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return child


def error_cause(stderr: str, returncode: int) -> str:
    """Why the child failed, in one line: its own error line, else the last line it wrote (a
    traceback's exception), else how it ended."""
    if returncode < 0:
        return f"the conversion was killed by signal {-returncode} (out of memory?)"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    own = [line[len(ERROR_PREFIX) :] for line in lines if line.startswith(ERROR_PREFIX)]
    if own:
        cause = own[-1]
    elif lines:
        cause = lines[-1]
    else:
        cause = f"the conversion exited with code {returncode}"
    return cause[:ONE_LINE_MAX]


# Keras 3 wraps a layer's failure in its model's ("... could not be deserialized properly ...
# Exception encountered: <the layer's>") and ends with the whole config: the cause is between.
_NESTED = "Exception encountered: "
_CONFIG_TAIL = " Full object config:"


def keras_cause(line: str) -> str:
    """A Keras load error's own cause, from the one line of it: the innermost exception Keras
    nested, without the config it appends; any other line as it is."""
    kind, colon, message = line.partition(": ")
    if _NESTED in message:
        message = message.rsplit(_NESTED, 1)[1]
    message = message.split(_CONFIG_TAIL, 1)[0]
    return f"{kind}{colon}{message}" if colon else line


def parse_args(argv: Sequence[str]) -> tuple[Path, Path]:
    """SRC DST, or ValueError (the usage)."""
    if len(argv) != 2 or not all(argv):
        raise ValueError(USAGE)
    return Path(argv[0]), Path(argv[1])


def read_keras_file(path: Path) -> KerasFile:
    """A .keras file's own account of itself, without TensorFlow: a zip archive with the
    model's config.json and, where Keras wrote one, metadata.json naming its version.
    ModelError naming the file where it is not one (garbage bytes, a truncated upload)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            if CONFIG_MEMBER not in names:
                raise ModelError(f"{path}: not a .keras file (no {CONFIG_MEMBER} in the archive)")
            metadata = (
                archive.read(METADATA_MEMBER).decode("utf-8", "replace")
                if METADATA_MEMBER in names
                else "{}"
            )
    except (zipfile.BadZipFile, EOFError):
        raise ModelError(f"{path}: not a .keras file (not a zip archive)") from None
    except OSError as exc:
        raise ModelError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        document = json.loads(metadata)
    except json.JSONDecodeError:
        document = {}
    version = document.get("keras_version") if isinstance(document, dict) else None
    return KerasFile(path, version if isinstance(version, str) else None)


# --- the child: imports TensorFlow ---------------------------------------------------------


def _installed_keras() -> tuple[str | None, bool]:
    """The keras package's version (None: none) and whether tf_keras is installed."""
    try:
        version: str | None = importlib.metadata.version("keras")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return version, importlib.util.find_spec("tf_keras") is not None


def _load_and_export(kind: Keras, source: Path, folder: Path) -> str:
    """Load `source` with `kind`'s Keras and write its SavedModel to `folder`; which Keras."""
    import tensorflow as tf  # noqa: PLC0415  (only in the child)

    if kind is Keras.KERAS3:
        import keras  # noqa: PLC0415

        model = keras.saving.load_model(str(source), compile=False)
        model.export(str(folder))
        return f"Keras {keras.__version__}"
    if kind is Keras.TF_KERAS:
        load_model: Any = importlib.import_module("tf_keras").models.load_model
        version = importlib.metadata.version("tf_keras")
    else:
        load_model = tf.keras.models.load_model
        version = importlib.metadata.version("keras")
    model = load_model(str(source), compile=False)
    tf.saved_model.save(model, str(folder))
    return f"Keras {version} ({kind.value})"


def convert(source: Path, dest: Path) -> str:
    """Export `source` to the SavedModel folder `dest`, atomically (a folder beside it, then a
    rename); a `dest` already there (another process's export) is kept. Returns which Keras."""
    saved = read_keras_file(source)
    kind = choose_keras(saved.saved_with, *_installed_keras())
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"{dest.name}.tmp-", dir=dest.parent))
    try:
        folder = scratch / "saved_model"
        used = _load_and_export(kind, source, folder)
        if not (folder / SAVED_MODEL).is_file():
            raise ModelError(f"the export wrote no {SAVED_MODEL}")
        try:
            folder.rename(dest)
        except OSError:
            if not (dest / SAVED_MODEL).is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return used


def main(argv: Sequence[str] | None = None) -> int:
    try:
        source, dest = parse_args(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    try:
        used = convert(source, dest)
    except ModelError as exc:
        print(f"{ERROR_PREFIX}{' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001  (Keras and TensorFlow raise many types)
        print(f"{ERROR_PREFIX}{keras_cause(one_line(exc))}", file=sys.stderr)
        return 1
    print(f"{DONE_PREFIX}{used}", flush=True)
    return 0


# --- the parent: no TensorFlow -------------------------------------------------------------


def keras_dir_from_env(env: Mapping[str, str]) -> Path:
    """The exports' folder: main.py's (SM_SERVE_KERAS_DIR), else one per user in the temporary
    folder (the app started without main.py: tests, `uvicorn serve.app:create_app`)."""
    folder = env.get(KERAS_DIR_ENV, "").strip()
    if folder:
        return Path(folder)
    return Path(tempfile.gettempdir()) / f"serve-keras-{os.getuid()}"


def run_export(
    source: Path, dest: Path, *, timeout_s: float = EXPORT_TIMEOUT_S, env: Mapping[str, str]
) -> str:
    """The child that converts `source` to `dest`: which Keras it used, or ModelError naming
    the file and the cause."""
    try:
        result = subprocess.run(
            export_argv(sys.executable, source, dest),
            env=export_env(env),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ModelError(
            f"cannot convert {source} to a SavedModel: no answer within {timeout_s:g} s"
        ) from None
    if result.returncode != 0:
        cause = error_cause(result.stderr, result.returncode)
        raise ModelError(f"cannot convert {source} to a SavedModel: {cause}")
    done = [line for line in result.stdout.splitlines() if line.startswith(DONE_PREFIX)]
    return done[-1][len(DONE_PREFIX) :] if done else "Keras"


def export_archive(
    archive: Archive,
    keras_dir: Path,
    *,
    timeout_s: float = EXPORT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> Archive:
    """`archive` with every .keras version converted (Archive.exports): each file not exported
    yet, one child process each, in catalog order; ModelError at the first that fails."""
    exports = dict(archive.exports)
    for path in archive.keras_files():
        if path in exports:
            continue
        source = archive.root / path
        try:
            stat = source.stat()
        except OSError as exc:
            raise ModelError(f"{source}: cannot read it ({exc.strerror or exc})") from None
        dest = export_folder(keras_dir, source.absolute(), stat.st_size, stat.st_mtime_ns)
        if not (dest / SAVED_MODEL).is_file():
            # Garbage bytes are refused here, without a child's TensorFlow import.
            saved = read_keras_file(source)
            started = time.monotonic()
            used = run_export(
                source, dest, timeout_s=timeout_s, env=os.environ if env is None else env
            )
            log.info(
                "%s (saved with Keras %s): converted to a SavedModel with %s in %.1f s",
                source, saved.saved_with or "?", used, time.monotonic() - started,
            )  # fmt: skip
        exports[path] = dest
    return dataclasses.replace(archive, exports=exports)


if __name__ == "__main__":
    sys.exit(main())
