"""`docker run IMAGE serve`: the built-in model's SavedModel as a SageMaker endpoint.

Pure core: `settings` (environment -> Settings), `codec` (request bodies -> uint8 batches,
predictions -> response bodies), `batching` (which queued requests share one model call).
`errors` (the one error type, carrying an HTTP status).
Shell: `model` (load + warm up), `batcher` (the asyncio loop around one model), `runner` (the
Runner interface: what answers a model's requests, chosen once at load) and `tf_runner` (the
SavedModel runners: TF Serving, the built-in classifier, code/inference.py hooks),
`multimodel` (SageMaker's /models API: one runner per loaded model), `app` (Starlette routes
shared by every runner), `main` (logging, uvicorn).
"""
