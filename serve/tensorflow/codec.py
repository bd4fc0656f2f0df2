"""Request bodies in, uint8 image batches out; probabilities in, response bodies out. Pure.

Inputs (Content-Type):
  image/png, image/jpeg, application/x-image, application/octet-stream   one encoded image
  application/json        {"instances": [{"b64": "<encoded image>"} | HxWx3 uint8 lists, ...]},
                          or the instances' list alone (SageMaker's body rule)
  application/jsonlines   one such instance per line
  application/x-npy       a uint8 array, HxWx3 or NxHxWx3
Outputs (Accept): application/json (default) or application/jsonlines.

Every problem with a request raises errors.ServeError with its HTTP status and a one-line message.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from serve.batching import Piece
from serve.errors import JSON, JSONLINES, ServeError, media_type
from serve.tensorflow import tfs
from serve.tensorflow.tfs import json_document_text

IMAGE_TYPES = frozenset(
    ("image/png", "image/jpeg", "application/x-image", "application/octet-stream")
)
JSONLINES_ALIASES = tfs.JSONLINES_ALIASES
NPY = "application/x-npy"
SUPPORTED_INPUTS = (*sorted(IMAGE_TYPES), JSON, JSONLINES, NPY)
CUSTOM_ATTRIBUTES_TOP_K = "top_k"
# PIL's decompression-bomb guard: a small file that would decode to gigabytes is refused.
MAX_IMAGE_PIXELS = 64 * 1024 * 1024


def choose_accept(header: str | None, default: str) -> str:
    """The response type for an Accept header: TF Serving's rule (tfs.choose_accept)."""
    return tfs.choose_accept(header, default)


def parse_top_k(custom_attributes: str | None, classes: int) -> int | None:
    """X-Amzn-SageMaker-Custom-Attributes such as 'top_k=3' (';' or ',' between key=value
    pairs; other keys are the caller's business and ignored). Capped at the class count."""
    if not custom_attributes:
        return None
    for item in custom_attributes.replace(",", ";").split(";"):
        key, sep, value = item.partition("=")
        if not sep or key.strip().lower() != CUSTOM_ATTRIBUTES_TOP_K:
            continue
        try:
            count = int(value.strip())
        except ValueError:
            raise ServeError(
                400, f"custom attribute top_k={value.strip()!r} is not an integer"
            ) from None
        if count < 1:
            raise ServeError(400, f"custom attribute top_k={count} must be at least 1")
        return min(count, classes)
    return None


# --- decoding ----------------------------------------------------------------------------------


def decode_image(data: bytes, what: str = "image") -> np.ndarray:
    """Encoded image bytes (any format pillow reads) -> HxWx3 uint8 RGB."""
    if not data:
        raise ServeError(400, f"{what}: empty body")
    try:
        with warnings.catch_warnings():
            # Above MAX_IMAGE_PIXELS pillow only warns; up to twice that, it raises. Refuse both.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                if image.width * image.height > MAX_IMAGE_PIXELS:
                    raise ServeError(
                        413,
                        f"{what}: {image.width}x{image.height} pixels is over the limit of "
                        f"{MAX_IMAGE_PIXELS}",
                    )
                return np.asarray(image.convert("RGB"), dtype=np.uint8)
    except ServeError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ServeError(413, f"{what}: {exc}") from None
    except UnidentifiedImageError:
        raise ServeError(400, f"{what}: not an image pillow can read") from None
    except (OSError, ValueError, SyntaxError) as exc:
        # Truncated or corrupt data surfaces here, while decoding.
        raise ServeError(400, f"{what}: unreadable image ({' '.join(str(exc).split())})") from None


def _image_array(value: Any, what: str) -> np.ndarray:
    """A nested list of HxWx3 integers 0..255 -> uint8 array."""
    try:
        array = np.asarray(value)
    except ValueError:
        raise ServeError(400, f"{what}: ragged nested lists, not an HxWx3 image") from None
    if array.ndim != 3 or array.shape[2] != 3 or array.shape[0] < 1 or array.shape[1] < 1:
        raise ServeError(400, f"{what}: shape {list(array.shape)}, expected [H, W, 3]")
    if array.dtype.kind not in "iu":
        raise ServeError(400, f"{what}: values must be integers 0-255, got {array.dtype.name}")
    if array.min() < 0 or array.max() > 255:
        raise ServeError(400, f"{what}: values must be integers 0-255")
    return array.astype(np.uint8)


def decode_instance(instance: Any, what: str) -> np.ndarray:
    """One JSON instance: {"b64": "..."} (TF Serving's binary convention) or pixel lists."""
    if isinstance(instance, dict):
        if set(instance) != {"b64"} or not isinstance(instance["b64"], str):
            raise ServeError(400, f'{what}: an object instance must be {{"b64": "<base64>"}}')
        try:
            data = base64.b64decode(instance["b64"], validate=True)
        except (binascii.Error, ValueError):
            raise ServeError(400, f"{what}: b64 is not valid base64") from None
        return decode_image(data, what)
    if isinstance(instance, list):
        return _image_array(instance, what)
    raise ServeError(
        400, f'{what}: expected {{"b64": ...}} or HxWx3 lists, got {type(instance).__name__}'
    )


def _loads(text: bytes | str, what: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ServeError(400, f"{what}: malformed JSON ({exc})") from None


def _decode_json(body: bytes) -> list[np.ndarray]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ServeError(400, f"body: malformed JSON ({exc})") from None
    # SageMaker's rule: a bare list or value is the instances (the SDK's predict(array) body).
    document = _loads(json_document_text(text), "body")
    if not isinstance(document, dict) or "instances" not in document:
        raise ServeError(400, 'JSON body must be {"instances": [...]}')
    instances = document["instances"]
    if not isinstance(instances, list) or not instances:
        raise ServeError(400, '"instances" must be a non-empty list')
    return [decode_instance(item, f"instance {i}") for i, item in enumerate(instances)]


def _decode_jsonlines(body: bytes) -> list[np.ndarray]:
    images: list[np.ndarray] = []
    for number, line in enumerate(body.splitlines(), start=1):
        if not line.strip():
            continue
        what = f"line {number}"
        images.append(decode_instance(_loads(line, what), what))
    if not images:
        raise ServeError(400, "JSON lines body has no instance")
    return images


def _decode_npy(body: bytes) -> list[np.ndarray]:
    try:
        array = np.load(io.BytesIO(body), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ServeError(400, f"body: not a .npy array ({' '.join(str(exc).split())})") from None
    if not isinstance(array, np.ndarray):
        raise ServeError(400, "body: not a single .npy array")
    if array.dtype != np.uint8:
        raise ServeError(400, f"npy array: dtype {array.dtype.name}, expected uint8")
    if array.ndim == 3:
        array = array[np.newaxis]
    if array.ndim != 4 or array.shape[3] != 3 or min(array.shape) < 1:
        raise ServeError(
            400, f"npy array: shape {list(array.shape)}, expected [H, W, 3] or [N, H, W, 3]"
        )
    return list(array)


def is_supported(content_type: str | None) -> bool:
    kind = media_type(content_type)
    return kind in IMAGE_TYPES or kind in JSONLINES_ALIASES or kind in (JSON, NPY)


def decode_body(body: bytes, content_type: str | None) -> list[np.ndarray]:
    """A request body -> its images (each HxWx3 uint8), in request order."""
    kind = media_type(content_type)
    if kind in IMAGE_TYPES:
        return [decode_image(body)]
    if kind == JSON:
        return _decode_json(body)
    if kind in JSONLINES_ALIASES:
        return _decode_jsonlines(body)
    if kind == NPY:
        return _decode_npy(body)
    shown = kind or "none"
    raise ServeError(
        415, f"unsupported Content-Type {shown!r}; send one of {', '.join(SUPPORTED_INPUTS)}"
    )


def image_piece(images: np.ndarray, model: str = "") -> Piece:
    """(n, H, W, 3) uint8 images of one size: one piece, keyed by model and size."""
    key = ("image", model, int(images.shape[1]), int(images.shape[2]))
    # Sized by their pixels: large images never run on the event loop.
    return Piece(key, len(images), images, images.nbytes)


def to_pieces(images: Sequence[np.ndarray], max_batch_size: int, model: str = "") -> list[Piece]:
    """Runs of consecutive same-size images, each cut to at most max_batch_size: a model call
    takes one size at a time, and no call may exceed the batch bound."""
    pieces: list[Piece] = []
    run: list[np.ndarray] = []
    for image in images:
        if run and (image.shape != run[0].shape or len(run) == max_batch_size):
            pieces.append(image_piece(np.stack(run), model))
            run = []
        run.append(image)
    if run:
        pieces.append(image_piece(np.stack(run), model))
    return pieces


# --- encoding ----------------------------------------------------------------------------------


def _finite(value: float) -> float:
    # JSON has no NaN; a broken model's NaN must not make an invalid document.
    return value if math.isfinite(value) else 0.0


def prediction(row: np.ndarray, classes: Sequence[str], top_k: int | None) -> dict[str, Any]:
    probabilities = [_finite(float(p)) for p in row]
    entry: dict[str, Any] = {
        "label": classes[int(np.argmax(row))],
        "probabilities": probabilities,
    }
    if top_k is not None:
        # Stable order for ties: the lower class index first.
        order = sorted(range(len(probabilities)), key=lambda i: (-probabilities[i], i))[:top_k]
        entry["top_k"] = [{"label": classes[i], "probability": probabilities[i]} for i in order]
    return entry


def encode_predictions(
    probabilities: np.ndarray, classes: Sequence[str], accept: str, top_k: int | None = None
) -> bytes:
    """(N, classes) probabilities -> the response body in `accept`'s format."""
    if probabilities.ndim != 2 or probabilities.shape[1] != len(classes):
        raise ValueError(
            f"model returned shape {list(probabilities.shape)} for {len(classes)} classes"
        )
    entries: Iterator[dict[str, Any]] = (prediction(row, classes, top_k) for row in probabilities)
    if accept == JSONLINES:
        return "".join(json.dumps(entry) + "\n" for entry in entries).encode()
    return json.dumps({"predictions": list(entries)}).encode()
