"""SavedModels: discovery (which models and versions a folder holds), loading (model.py, the
only place TensorFlow is imported), TF Serving's REST rules (tfs.py), the built-in
classifier's bodies (codec.py) and the runners that answer them (runner.py)."""
