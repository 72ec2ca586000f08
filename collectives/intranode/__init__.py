"""Intra-node stages: host buffers through shared memory (shm.py, over the protocol of protocol.py, run by
compiled.py or interpreted.py) and device buffers through CUDA IPC (ipc.py); both tell each other how far
they are through the counters of counters.py, waiting as wait.py says."""
