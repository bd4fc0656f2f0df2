"""`docker run IMAGE serve`: the built-in model's SavedModel as a SageMaker endpoint.

Pure core: `settings` (environment -> Settings), `codec` (request bodies -> uint8 batches,
predictions -> response bodies), `batching` (which queued requests share one model call).
Shell: `model` (load + warm up), `batcher` (the asyncio loop around one model), `app`
(Starlette routes), `main` (logging, uvicorn).
"""
