"""The SageMaker entry point: N training hosts become one distributed job, by one of several
launches (mpirun over ssh, the program once per host, tf.distribute's tasks over TF_CONFIG).

The pure core turns the SageMaker contract into a plan: `contract` parses it, `plan` decides the
job's shape, environment and one closed `Launch` value; `tf_config`, `protocol`, `sshkeys`,
`failure` and `names` are pure too. The shell obeys the plan: `launchers` turns the Launch into
this host's local part and starts its processes, `supervise` runs the master's or a worker's
loop (and sshd), `coordination` carries the channel between hosts, `usercode` fetches the
user's code and installs its requirements, `main` ties them together. docs/backends.md shows how
a launch flows and what adding one touches.
"""
