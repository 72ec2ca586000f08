"""The GPUs the compute model knows, at their published peak rates, and the one efficiency and launch floor
it applies to all of them.

A layer's modelled time on a GPU is the longer of its FLOPs at EFFICIENCY x the peak FP32 rate and its
bytes at EFFICIENCY x the peak memory bandwidth, and at least LAUNCH_FLOOR_S per kernel it launches.
Caffe trains in FP32, so the FP32 rate without tensor cores is the one used (cuDNN may use TF32 tensor
cores on an H100 and beat it: the model is then pessimistic for convolutions).

The two constants are fitted to scaffe's AlexNet b128 and GoogLeNet b32 iterations, replayed from CUDA
graphs, on an H200 (the H100's chip, its FP32 rate, more memory bandwidth): big layers set the efficiency,
GoogLeNet's hundreds of small convolutions, far below peak, the floor. Layer by layer the device times
(perf/layer_times.py, against the model with perf/model_check.py; logs in perf/h200/) spread around it, as
cuDNN's algorithms differ by layer. The measurements and the earlier constants: perf/RESULTS.md, "A GPU at last".

Sources (NVIDIA's datasheets):
- k80: one of the two GK210 GPUs of a Tesla K80 board (S-Caffe's cluster had 8 boards, 16 GPUs, a node):
  8.73 TFLOP/s FP32 with GPU Boost and 480 GB/s per board, so 4.37 TFLOP/s and 240 GB/s per GPU.
- v100: Tesla V100 SXM2, 15.7 TFLOP/s FP32, 900 GB/s HBM2.
- h100: H100 SXM5, 67 TFLOP/s FP32, 3.35 TB/s HBM3.
"""

EFFICIENCY = 0.44      # of peak, for both FLOPs and bytes: what cuDNN/cuBLAS reach on layers of these sizes
LAUNCH_FLOOR_S = 35e-6  # the least a modelled kernel takes: a small layer's kernels run far below peak
UPDATE_FLOOR_S = 5e-6   # the least the solver's fused update of a piece takes: one elementwise kernel's launch

GPUS = {
    # name: (peak FP32 FLOP/s, peak memory bytes/s)
    "k80": (4.37e12, 240e9),
    "v100": (15.7e12, 900e9),
    "h100": (67e12, 3.35e12),
}


def layer_seconds(gpu, flops, nbytes, kernels, efficiency=EFFICIENCY):
    """One pass of a layer on `gpu`: `flops` operations, `nbytes` moved, `kernels` launched (`efficiency`:
    another in the model's place, as perf/model_check.py fits one)."""
    peak_flops, peak_bytes = GPUS[gpu]
    work = max(flops / (efficiency * peak_flops), nbytes / (efficiency * peak_bytes))
    return max(work, kernels * LAUNCH_FLOOR_S)


def update_seconds(gpu, elements, history_sets=1):
    """The solver's fused update of `elements` learnable values on `gpu`: it reads the gradient, the value
    and each history set and writes the value and the history (one kernel)."""
    peak_bytes = GPUS[gpu][1]
    return max(4 * elements * (3 + 2 * history_sets) / (EFFICIENCY * peak_bytes), UPDATE_FLOOR_S)
