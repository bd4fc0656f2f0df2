"""This host's plumbing, shared by every launch, and what runs beside the job's processes:
child processes (`children`), the rank registry and the shim every rank starts through (`ranks`,
`rank_shim`), a private Unix server (`unixserver`), the network interface (`netif`), probes
(`probes`, `oom`), ssh keys (`sshkeys`), the user's code (`usercode`), and each rank's output,
progress and stack (`rank_output`, `activity`, `stacks`).

Imports nothing: `rank_shim` and others run as scripts or small modules.
"""
