"""Intra-node stages: shared memory for host buffers (shm.py); CUDA IPC for device buffers comes with the GPU path."""
