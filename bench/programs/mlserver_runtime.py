"""MLServer (the `mlserver` package) with a custom runtime that calls the SavedModel's serving
signature once per request (signature_call.py): the serving benchmark's MLServer peer,
answering the V2 (Open Inference) protocol at POST /v2/models/model/infer. One input: numbers
as FP32/INT tensors, strings and base64 PNG images as BYTES. Outputs: one V2 tensor per
signature output (BYTES as text), plus `label` for a model with classes.json.

    PYTHONPATH=/opt/bench /opt/mlserver/bin/mlserver start /opt/bench/mlserver
"""

from __future__ import annotations

import numpy as np
from mlserver import MLModel
from mlserver.codecs import NumpyCodec, StringCodec
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput
from signature_call import Signature


class SavedModelRuntime(MLModel):
    async def load(self) -> bool:
        self.signature = Signature.load()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        [request_input] = payload.inputs
        if request_input.datatype == "BYTES":
            instances = StringCodec.decode_input(request_input)
        else:
            instances = NumpyCodec.decode_input(request_input)
        outputs = self.signature(self.signature.batch(instances))
        encoded: list[ResponseOutput] = []
        for name, value in sorted(outputs.items()):
            if value.dtype == object:
                texts = [item.decode("utf-8", "replace") for item in value.reshape(-1)]
                encoded.append(StringCodec.encode_output(name, texts))
            else:
                encoded.append(NumpyCodec.encode_output(name, value))
        if self.signature.classes is not None:
            labels = [
                self.signature.classes[int(i)] for i in np.argmax(outputs["probabilities"], 1)
            ]
            encoded.append(StringCodec.encode_output("label", labels))
        return InferenceResponse(model_name=self.name, outputs=encoded)
