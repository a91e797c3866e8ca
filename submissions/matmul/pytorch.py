#!POPCORN leaderboard matmul
#!POPCORN gpu H100

# Matrix multiplication in plain PyTorch: `a @ b` on float16 CUDA tensors calls cuBLAS, which
# runs Hopper's wgmma tensor-core kernels with float32 accumulation, near the GPU's peak
# (measured 769 TFLOP/s at 8192^3 on an H100 80GB HBM3).
# This is the number to beat, and it is hard to beat at large sizes.

import torch


def custom_kernel(data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    a, b = data
    return a @ b
