"""`docker run IMAGE serve`: a model as a SageMaker endpoint (or batch transform).

The core, shared by every runner: `settings` (environment -> Settings), `errors` (the one
error type, carrying an HTTP status, and the one Accept rule), `batching` (which queued
requests share one model call), `batcher` (the asyncio loop around one model), `heap` (the
garbage collector frozen after a load), `hooks` (the model's code/: requirements, lib,
inference.py), `runner` (the Runner interface: what answers a model's requests, chosen once at
load), `multimodel` (SageMaker's /models API: one runner per loaded model), `app` (Starlette
routes shared by every runner), `page`, `logs`, `main` (checks, then uvicorn).

`tensorflow/`: SavedModels and .keras files (discovery, loading, TF Serving's REST rules, the
built-in classifier's bodies, their runners). `torch/`: PyTorch models (the inference
contract's hooks and bodies). Each is imported only where its framework is the image's.
"""
