"""What every part of the server shares about HTTP: the one error type (a status and a one-line
message), the JSON media types, and the error body. Pure."""

from __future__ import annotations

import json
from collections.abc import Mapping

JSON = "application/json"
JSONLINES = "application/jsonlines"

# tensorflow::Status::ToString()'s prefix for a status, as TF Serving nests one error in another.
_STATUS_PREFIX = {400: "Invalid argument", 404: "Not found", 501: "Unimplemented"}


class ModelError(Exception):
    """A model folder the server cannot serve (any runner's); one line naming the file."""


class ServeError(Exception):
    """A request (or a load) the server refuses: `status` is the HTTP status, the message one
    line. Every runner, codec and route raises this one type; the app turns it into
    `{"error": message}` with that status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    def status_string(self) -> str:
        """tensorflow::Status::ToString(), as TF Serving nests it in other messages."""
        return f"{_STATUS_PREFIX.get(self.status, 'Unknown')}: {self}"


def media_type(header: str | None) -> str:
    """'Application/JSON; charset=utf-8' -> 'application/json'; a missing header -> ''."""
    return (header or "").split(";", 1)[0].strip().lower()


_ANY = ("*/*", "application/*", "")


def requested_accept(header: str | None, default: str) -> str:
    """What the client asks for, as a user's hook sees it: the Accept header, or `default`
    (SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT) where there is none or it is */* (AWS's inference
    toolkit, and its PyTorch and scikit-learn containers, do the same)."""
    if not header or media_type(header.split(",", 1)[0]) in _ANY:
        return default
    return header.strip()


def choose_accept(header: str | None, default: str, writes: Mapping[str, str]) -> str:
    """The response type for an Accept header: the type `writes` maps the first it knows to, in
    the client's order (q-values are not weighed: SageMaker clients send one type); */*,
    application/* or no header -> `default` (SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT). Nothing
    written -> 406, naming what is."""
    if not header or not header.strip():
        return default
    for item in header.split(","):
        kind = media_type(item)
        if kind in _ANY:
            return default
        if kind in writes:
            return writes[kind]
    offered = ", ".join(dict.fromkeys(writes.values()))
    raise ServeError(406, f"cannot answer in {header.strip()!r}; Accept one of {offered}")


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


# TensorFlow's messages can run to pages (a whole graph); one line stays readable.
ONE_LINE_MAX = 1000


def one_line(exc: BaseException) -> str:
    """'TypeName: message' on one line, at most ONE_LINE_MAX characters (for errors that are
    not ServeError): every runner's and the app's, one rule."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:ONE_LINE_MAX]
