"""The runners for SavedModels (TensorFlow is imported by serve.tensorflow.model's loading
functions only, so importing this module costs nothing on an image without TensorFlow).

`TensorflowRunner` answers each model of an archive the way it was composed at load: a model
with classes.json (the built-in classifier) answers images with labels (`codec`); every other
SavedModel answers TF Serving's REST requests (`tfs`). One batcher per runner.
`HooksRunner` puts code/inference.py's hooks around a TensorflowRunner.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio.from_thread
import anyio.to_thread
import numpy as np

from serve import hooks
from serve.batcher import Batcher
from serve.batching import Piece, cut_rows, join_rows, rows_per_call
from serve.errors import JSON, ServeError, error_body, media_type, requested_accept
from serve.runner import CUSTOM_ATTRIBUTES, Incoming, ModelInfo, Outgoing, Runner, off_loop
from serve.settings import Settings
from serve.tensorflow import codec, keras_export, tfs
from serve.tensorflow.model import Model, Registry, Version, load_registry, scan, serialize_examples

log = logging.getLogger("serve")


@dataclasses.dataclass(frozen=True)
class Loaded:
    """What loading a model archive gives: its models and code/inference.py's hooks."""

    registry: Registry
    hooks: hooks.Hooks | None = None


def load_archive(
    model_dir: Path,
    default_model: str | None = None,
    *,
    name: str | None = None,
    code: Path | None = None,
    timeout_s: float = 60.0,
) -> Loaded:
    """Every model and version under `model_dir` (its .keras files as SavedModels), and its
    code/inference.py's hooks. `name`:
    a multi-model endpoint's name for the one model the folder holds; `code`: its code folder
    when that is not the model's own code/; `timeout_s`: each model call's session deadline.
    inference.py is imported first: what it imports (TF Text, a custom op library) registers
    its ops before the models that use them load."""
    archive = scan(model_dir, default_model)
    if name is not None:
        if len(archive.catalog.models) != 1:
            found = ", ".join(m.name for m in archive.catalog.models)
            raise ServeError(400, f"{model_dir} holds several models ({found}); expected one")
        found_name = archive.catalog.models[0].name
        entry = dataclasses.replace(archive.catalog.models[0], name=name)
        labels = {name: archive.labels[found_name]} if found_name in archive.labels else {}
        catalog = dataclasses.replace(archive.catalog, models=(entry,), default=name)
        archive = dataclasses.replace(archive, catalog=catalog, labels=labels)
    # .keras files: main.py converted them before the workers started (found here, nothing to
    # do); a multi-model load converts its own now.
    archive = keras_export.export_archive(archive, keras_export.keras_dir_from_env(os.environ))
    user = hooks.load_hooks(model_dir, code)
    return Loaded(load_registry(archive, timeout_s), user)


def compose(loaded: Loaded, settings: Settings, *, port: int | None = None) -> Runner:
    """The runner for a loaded archive, decided once: hooks around TF Serving, or TF Serving
    (and the classifier's labels) alone."""
    runner = TensorflowRunner(loaded.registry, settings)
    if loaded.hooks is None:
        return runner
    return HooksRunner(runner, loaded.hooks, settings.port if port is None else port)


class TensorflowRunner:
    def __init__(self, registry: Registry, settings: Settings) -> None:
        self.registry = registry
        self.settings = settings
        self.batcher = Batcher(
            registry.run,
            max_batch_size=settings.max_batch_size,
            max_delay_s=settings.max_batch_delay_ms / 1000,
            max_queued_images=settings.max_queued_images,
            request_timeout_s=settings.request_timeout_s,
            merge=settings.batching,
            run_inline=registry.run_inline,
        )
        # Composed once: each model's way of answering /invocations.
        self._invokers: dict[str, Callable[..., Awaitable[Outgoing]]] = {
            name: self._images if model.classes is not None else self._tensors
            for name, model in registry.models.items()
        }

    @property
    def models(self) -> Sequence[ModelInfo]:
        ordered = sorted(
            self.registry.models.values(), key=lambda m: m.name != self.registry.default
        )
        return [ModelInfo(m.name, sorted(m.versions), m.classes) for m in ordered]

    @property
    def summary(self) -> str:
        if not self.settings.batching:
            return "each request its own model call (batching off)"
        return (
            f"batching on: batches of up to {self.settings.max_batch_size}, "
            f"up to {self.settings.max_batch_delay_ms:.1f} ms wait"
        )

    def start(self) -> None:
        self.batcher.start()

    async def stop(self) -> None:
        stats = self.batcher.stats
        log.info(
            "drained; served %d instance(s) in %d model call(s), largest batch %d",
            stats.images,
            stats.calls,
            stats.largest,
        )
        await self.batcher.stop()
        # Off the loop: closing a session cancels a call still running in it.
        await anyio.to_thread.run_sync(self.registry.close)

    async def invoke(self, incoming: Incoming) -> Outgoing:
        header = incoming.header(CUSTOM_ATTRIBUTES)
        attributes = tfs.parse_custom_attributes(header)
        model, version = self.registry.resolve(attributes.model_name, attributes.model_version)
        return await self._invokers[model.name](incoming, model, version, attributes.method)

    async def _wait(self, pieces: list[Piece]) -> list[Any]:
        if len(pieces) == 1:
            done, result = self.batcher.run_now(pieces[0])
            if done:
                return [result]
        # The batcher answers TimeoutError past settings.request_timeout_s.
        return await self.batcher.collect(self.batcher.submit(pieces))

    async def _tensors(
        self, incoming: Incoming, model: Model, version: Version, method: str
    ) -> Outgoing:
        content_type = incoming.header("content-type")
        kind = media_type(content_type)
        # Refuse an unknown type before reading a body we cannot use.
        if kind not in tfs.JSON_TYPES and kind != tfs.CSV:
            raise ServeError(415, f"Unsupported Media Type: {content_type or ''}")
        accept = tfs.choose_accept(incoming.header("accept"), self.settings.default_accept)
        with self.batcher.in_flight():
            body = await incoming.read_body()
            document = await off_loop(len(body), tfs.request_document, body, content_type)
            answer = await self.answer(model, version, method, document, len(body))
        return Outgoing(200, answer, accept)

    async def answer(
        self, model: Model, version: Version, method: str, document: Any, size: int
    ) -> bytes:
        """TF Serving's answer to one parsed request: predict, classify or regress."""
        specs = version.specs
        if method == "predict":
            request = await off_loop(size, tfs.parse_predict, document, specs)
            signature = version.signatures[request.signature_name]
            if request.columnar:
                inputs = request.inputs
                piece = Piece(
                    ("alone",), 1, lambda: signature.call(inputs), size, False, inline=False
                )
                [outputs] = await self._wait([piece])
                return await off_loop(size, tfs.predict_response, outputs, True)
            shapes = tuple(
                (name, tensor.dtype.str, tensor.shape[1:])
                for name, tensor in sorted(request.inputs.items())
            )
            key = ("rows", model.name, version.number, request.signature_name, shapes)
            # Merged with other requests only where the owner switched batching on and the
            # signature's batch dimension is free; then a request larger than one model call is
            # cut into model-sized runs too. Otherwise a request is one call, as TF Serving's.
            merge = self.settings.batching and signature.spec.batch_free
            if merge and request.rows > self.settings.max_batch_size:
                rows = rows_per_call(request.inputs, self.settings.max_batch_size)
                runs = cut_rows(request.inputs, rows)
            else:
                runs = [request.inputs]
            pieces = [
                Piece(key, count, run, size * count // request.rows, merge)
                for run in runs
                for count in (len(next(iter(run.values()))),)
            ]
            results = await self._wait(pieces)
            try:
                outputs = join_rows(results)
            except ValueError as exc:
                raise ServeError(
                    400, f"{exc}: send at most {self.settings.max_batch_size} rows per request"
                ) from None
            return await off_loop(size, tfs.predict_response, outputs, False)
        examples = tfs.parse_examples(document, method)
        tfs.pick_signature(specs, examples.signature_name)
        signature = version.signatures[examples.signature_name]
        expected = f"tensorflow/serving/{method}"
        if signature.spec.method != expected:
            kind = "classification" if method == "classify" else "regression"
            raise ServeError(
                400,
                f"Expected {kind} signature method_name to be {expected}. "
                f"Was: {signature.spec.method}",
            )
        serialized = await off_loop(size, serialize_examples, examples.examples)
        if signature.examples is not None:
            feed = signature.examples
            piece = Piece(("alone",), len(serialized), lambda: feed(serialized), size, False, False)
        else:
            if len(signature.spec.inputs) != 1:
                raise ServeError(
                    400,
                    f"signature {examples.signature_name!r} takes "
                    f"{', '.join(sorted(signature.spec.inputs))}; classify and regress feed one "
                    "input of serialized tf.Examples",
                )
            [input_name] = signature.spec.inputs
            piece = Piece(
                ("alone",),
                len(serialized),
                lambda: signature.call({input_name: serialized}),
                size,
                False,
                False,
            )
        [outputs] = await self._wait([piece])
        return await off_loop(size, tfs.examples_response, outputs, method)

    async def answer_body(self, model: Model, version: Version, method: str, body: bytes) -> bytes:
        document = await off_loop(
            len(body), lambda: tfs.parse_document(body.decode("utf-8", "replace"))
        )
        return await self.answer(model, version, method, document, len(body))

    async def _images(
        self, incoming: Incoming, model: Model, _version: Version, _method: str
    ) -> Outgoing:
        """The built-in classifier: images (or pixel lists) in, labels and probabilities out."""
        classes = model.classes or ()
        settings = self.settings
        accept = codec.choose_accept(incoming.header("accept"), settings.default_accept)
        content_type = incoming.header("content-type")
        if not codec.is_supported(content_type):
            codec.decode_body(b"", content_type)
        top_k = codec.parse_top_k(incoming.header(CUSTOM_ATTRIBUTES), len(classes))
        with self.batcher.in_flight():
            body = await incoming.read_body()
            images = await off_loop(len(body), codec.decode_body, body, content_type)
            pieces = codec.to_pieces(images, settings.max_batch_size, model.name)
            results = await self._wait(pieces)
        probabilities = np.concatenate(results) if len(results) > 1 else results[0]
        payload = codec.encode_predictions(probabilities, classes, accept, top_k)
        return Outgoing(200, payload, accept)

    async def rest(self, method: str, path: str, incoming: Incoming) -> Outgoing:
        """TF Serving's REST API itself: POST /v1/models/NAME[/versions/N]:METHOD, GET status."""
        name, version_number, verb = tfs.parse_model_path(path)
        model, version = self.registry.resolve(name, version_number)
        if method == "GET":
            if verb is not None:
                raise ServeError(404, f"Malformed request: GET /v1/models/{path}")
            shown = sorted(model.versions) if version_number is None else [version.number]
            return Outgoing(200, tfs.status_body(shown))
        if verb not in tfs.METHODS:
            raise ServeError(404, f"Malformed request: POST /v1/models/{path}")
        with self.batcher.in_flight():
            body = await incoming.read_body()
            answer = await self.answer_body(model, version, verb, body)
        return Outgoing(200, answer)


class HooksRunner:
    """code/inference.py: handler, or input_handler -> the model -> output_handler (AWS's
    container: a failed model response goes through output_handler too)."""

    def __init__(self, inner: TensorflowRunner, user: hooks.Hooks, port: int) -> None:
        self.inner = inner
        self.user = user
        self.port = port

    @property
    def models(self) -> Sequence[ModelInfo]:
        return self.inner.models

    @property
    def summary(self) -> str:
        return f"code/inference.py hooks; {self.inner.summary}"

    def start(self) -> None:
        self.inner.start()

    async def stop(self) -> None:
        await self.inner.stop()

    async def rest(self, method: str, path: str, incoming: Incoming) -> Outgoing:
        return await self.inner.rest(method, path, incoming)

    async def invoke(self, incoming: Incoming) -> Outgoing:
        attributes = tfs.parse_custom_attributes(incoming.header(CUSTOM_ATTRIBUTES))
        model, version = self.inner.registry.resolve(
            attributes.model_name, attributes.model_version
        )
        # The script writes what it likes: its hooks see the Accept asked for (the default
        # for none or */*), and a body it returns alone gets the type TF Serving would give.
        accept = requested_accept(incoming.header("accept"), self.inner.settings.default_accept)
        body = await incoming.read_body()
        context = hooks.Context(
            model_name=model.name,
            model_version=str(version.number),
            method=attributes.method,
            rest_uri=hooks.rest_uri(
                self.port, model.name, attributes.model_version, attributes.method
            ),
            grpc_port=None,
            channel=None,
            custom_attributes=incoming.header(CUSTOM_ATTRIBUTES),
            request_content_type=incoming.header("content-type"),
            accept_header=accept,
            content_length=len(body),
        )
        timeout = self.inner.settings.request_timeout_s

        async def model_response(processed: bytes) -> hooks.ModelResponse:
            try:
                answer = await self.inner.answer_body(model, version, attributes.method, processed)
            except ServeError as exc:
                return hooks.ModelResponse(exc.status, error_body(str(exc)))
            except TimeoutError:
                message = f"no prediction within {timeout:g} s (model busy)"
                return hooks.ModelResponse(504, error_body(message))
            return hooks.ModelResponse(200, answer, {"content-type": JSON})

        user = self.user

        def run_hooks() -> tuple[int, Any]:
            data = io.BytesIO(body)
            if user.handler is not None:
                return 200, user.handler(data, context)
            processed = user.input_handler(data, context) if user.input_handler else body
            response = anyio.from_thread.run(model_response, hooks.as_body(processed))
            if user.output_handler is not None:
                return 200, user.output_handler(response, context)
            return response.status_code, (response.content, JSON)

        try:
            status, result = await anyio.to_thread.run_sync(run_hooks)
        except ServeError:
            raise
        except Exception as exc:  # noqa: BLE001  (the user's hook: its message, as AWS's container)
            raise ServeError(500, " ".join(str(exc).split()) or type(exc).__name__) from None
        try:
            written = tfs.choose_accept(accept, self.inner.settings.default_accept)
        except ServeError:  # a type only the script knows: it answered, not us
            written = self.inner.settings.default_accept
        answer, answer_type = hooks.as_response(result, written)
        return Outgoing(status, answer, answer_type)
