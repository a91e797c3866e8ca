#!POPCORN leaderboard grayscale
#!POPCORN gpu H100
#
# grayscale: a simple, correct CUDA kernel, rendered by `popkit new` (style: inline)
# from grayscale/kernel.yml.
# The extension builds once, when this module is imported; custom_kernel(data) is the entry point.
# Check the build with `popkit compile FILE`, the output with `popkit test FILE`.

import torch
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <torch/types.h>
#include <cmath>
#include <cstdint>

__global__ void grayscale_kernel(const float* __restrict__ rgb,
                                 float* __restrict__ gray,
                                 int64_t rows,
                                 int64_t cols) {
    // One thread per (row, col), idx = row * cols + col; the loop over rows goes past 65535 blocks.
    const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    for (int64_t row = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; row < rows;
         row += static_cast<int64_t>(gridDim.y) * blockDim.y) {
        const int64_t idx = row * cols + col;
        const float* px = rgb + idx * 3;
        gray[idx] = 0.2989f * px[0] + 0.5870f * px[1] + 0.1140f * px[2];
    }
}

torch::Tensor grayscale(torch::Tensor rgb) {
    TORCH_CHECK(rgb.is_cuda(), "grayscale: `rgb` must be a GPU tensor");
    TORCH_CHECK(rgb.scalar_type() == at::kFloat, "grayscale: `rgb` must be float32, got ", rgb.scalar_type());
    rgb = rgb.contiguous();
    TORCH_CHECK(rgb.dim() >= 2, "grayscale: `rgb` must have at least 2 dimensions");
    const int64_t rows = rgb.size(0);
    const int64_t cols = rgb.size(1);
    std::vector<int64_t> gray_sizes;
    for (int64_t d = 0; d < rgb.dim(); ++d) {
        if (d != rgb.dim() - 1) gray_sizes.push_back(rgb.size(d));
    }
    torch::Tensor gray = torch::empty(gray_sizes, rgb.options().dtype(at::kFloat));
    if (rows > 0 && cols > 0) {
        const dim3 block(32, 8);
        const int64_t blocks_y = std::min<int64_t>((rows + 7) / 8, 65535);
        const dim3 grid(static_cast<unsigned int>((cols + 31) / 32), static_cast<unsigned int>(blocks_y));
        grayscale_kernel<<<grid, block>>>(static_cast<const float*>(rgb.data_ptr()),
                                          static_cast<float*>(gray.data_ptr()),
                                          rows,
                                          cols);
        const cudaError_t err = cudaGetLastError();
        TORCH_CHECK(err == cudaSuccess, "grayscale_kernel failed to launch: ", cudaGetErrorString(err));
    }
    return gray;
}
"""

CPP_SRC = r"""
torch::Tensor grayscale(torch::Tensor rgb);
"""

# Built once, at import: the leaderboard's compile step warms the cache for every later process.
_module = load_inline(
    name="popkit_grayscale_cuda_inline",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["grayscale"],
    extra_cuda_cflags=["-O3"],
    verbose=True,
)


def custom_kernel(data):
    """data: rgb (float32); returns a new float32 tensor: rgb without dims [-1]."""
    rgb = data
    return _module.grayscale(rgb)
