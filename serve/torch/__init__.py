"""PyTorch models (the torch images): SageMaker's PyTorch inference contract, the user's hooks
around the model (runner.py) and the default hooks' bodies in and out (codec.py, pure)."""
