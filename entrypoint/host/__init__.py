"""This host's plumbing, shared by every launch: child processes (`children`), the rank registry
and the shim every rank starts through (`ranks`, `rank_shim`), a private Unix server
(`unixserver`), the network interface (`netif`), probes (`probes`), ssh keys (`sshkeys`), the
user's code (`usercode`), and the stall and fault readers (`rank_output`, `activity`, `stacks`,
`oom`).

Imports nothing: `rank_shim` and others run as scripts or small modules.
"""
