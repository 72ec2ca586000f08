"""Training that survives a lost host: committed state in host memory, and a supervisor that relaunches."""
