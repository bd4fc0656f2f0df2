"""Under SDK v3's Torchrun(): rank 0 saves a seeded linear layer as TorchScript (model.pt, what
serve's default model_fn loads) and prints its answer to ROWS, for the deploy test to compare."""

import json
import os

import torch

ROWS = [[1.0, 2.0, 3.0, 4.0], [0.0, -1.0, 0.5, 2.0]]

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
if os.environ.get("RANK", "0") == "0":
    torch.jit.save(torch.jit.script(model), os.path.join(os.environ["SM_MODEL_DIR"], "model.pt"))
    with torch.no_grad():
        print("EXPECTED " + json.dumps(model(torch.tensor(ROWS)).tolist()), flush=True)
