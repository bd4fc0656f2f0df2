"""The coordination channel between the hosts: `protocol` (its messages and the verdict rules,
pure), `session` (one framed connection), `coordination` (the master's and a worker's side).
"""
