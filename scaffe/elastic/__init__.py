"""Training that survives a lost host: commits of the training state in host memory, replicated to another
host, and resumption from one at another rank count (settings, state, replication, committer, resume); and
the supervisor that relaunches a failed job on the hosts left (supervisor, hosts, launchers, spread)."""
