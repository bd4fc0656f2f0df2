"""tf.distribute's strategies over TF_CONFIG: `layouts` (the TF_CONFIG layouts as data, and the
launch built from them), `part` (a host's tasks), `ps_server` (the parameter server the entry
point runs itself, a child process: the entry point's own process never imports TensorFlow).
"""
