"""The MPI launch, in one place: mpirun on the master starts every rank (orted on the workers,
over the coordination channel by default or over ssh).

- `plan`: the launch value (MpiLaunch) and its builder, mpirun's argv, the remote shell's flags,
  the call-back deadline (pure);
- `parts`: the master's part (mpirun) and a worker's (the ranks orted starts), each with what it
  brings to the channel for its remote shell;
- `remote_shell`: the channel launch's messages, the worker's orted spawner and the master's
  relay for the rsh agent; `orted_command` parses the command OpenMPI sends (pure);
- `rsh_agent`: the agent mpirun runs instead of ssh (a standard-library script).

The image installs `rsh_agent` as a script run by `python -IS` (Dockerfile): it imports none of
these packages.
"""
