"""The SageMaker entry point: N training hosts become one distributed job, by one of several
launches (mpirun over ssh or the channel, the program once per host, torchrun, tf.distribute's
tasks over TF_CONFIG).

The pure core turns the SageMaker contract into a plan: `contract` parses it, `plan` decides the
job's shape, environment and one closed `Launch` value, built by its launch under `launches/`
(one module or folder per launch, each with its builder and its part). The shell obeys the plan:
`launches.local_part` turns the Launch into this host's part (`part` has the interface),
`supervise` runs the master's or a worker's loop, `channel/` carries the channel between hosts,
`host/` holds this host's plumbing (child processes, the rank registry, ssh keys, the user's
code), `main` ties them together. docs/backends.md shows how a launch flows and what adding one
touches.
"""
