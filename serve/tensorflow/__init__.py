"""SavedModels: discovery (which models and versions a folder holds, .keras files included),
loading (model.py, the only place the server imports TensorFlow), .keras files converted to
SavedModels in a child process (keras_export.py), TF Serving's REST rules (tfs.py), the
built-in classifier's bodies (codec.py) and the runners that answer them (runner.py)."""
