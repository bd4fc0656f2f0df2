"""KServe's Python model server (the `kserve` package) with a custom model that calls the
SavedModel's serving signature once per request (signature_call.py): the serving benchmark's
KServe peer, answering the V1 protocol at POST /v1/models/model:predict with
`{"instances": [...]}` (images as `{"b64": ...}`) and `{"predictions": [...]}` back.

    PYTHONPATH=/opt/bench /opt/kserve/bin/python /opt/bench/kserve_server.py --http_port 8080
"""

from __future__ import annotations

from typing import Any

import kserve
from signature_call import Signature


class SavedModelPredictor(kserve.Model):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.signature: Signature | None = None
        self.load()

    def load(self) -> bool:
        self.signature = Signature.load()
        self.ready = True
        return self.ready

    def predict(self, payload: Any, headers: dict[str, str] | None = None) -> dict:
        assert self.signature is not None
        batch = self.signature.batch(payload["instances"])
        return {"predictions": self.signature.predictions(self.signature(batch))}


if __name__ == "__main__":
    kserve.ModelServer().start([SavedModelPredictor("model")])
