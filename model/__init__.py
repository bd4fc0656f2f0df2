"""The built-in training program: a Horovod + Keras image classifier.

Importing this package must stay cheap (no TensorFlow): the entry point and the launcher
import `model.hparams` and `model.logline` to validate input and describe metrics.
"""
