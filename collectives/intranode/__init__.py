"""Intra-node stages: host buffers through shared memory (shm.py, over the protocol of protocol.py, run by
compiled.py or interpreted.py); CUDA IPC for device buffers comes with the GPU path."""
