"""The SageMaker entry point: N training hosts become one Horovod job over MPI and ssh.

The pure core (`contract`, `plan`, `sshkeys`) turns the SageMaker contract into a plan and an
`mpirun` command; `supervise` is the only module that starts processes or handles signals.
"""
