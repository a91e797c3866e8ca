#!POPCORN leaderboard grayscale
#!POPCORN gpu H100
#
# grayscale: a simple, correct CUDA kernel, rendered by `popkit new` (style: library)
# from grayscale/kernel.yml.
# The extension builds once, when this module is imported; custom_kernel(data) is the entry point.
# Check the build with `popkit compile FILE`, the output with `popkit test FILE`.

import torch
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <torch/types.h>
#include <torch/library.h>
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

TORCH_LIBRARY_IMPL(popkit_grayscale, CUDA, m) {
    m.impl("grayscale", &grayscale);
}
"""

CPP_SRC = r"""
#include <torch/library.h>

TORCH_LIBRARY(popkit_grayscale, m) {
    m.def("grayscale(Tensor rgb) -> Tensor");
}
"""

# The source registers the operator popkit_grayscale::grayscale: its schema in TORCH_LIBRARY (C++ source),
# its GPU implementation in TORCH_LIBRARY_IMPL (kernel source). is_python_module=False loads the
# built library into this process, which runs both registrations.
load_inline(
    name="popkit_grayscale_cuda_library",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    is_python_module=False,
    extra_cuda_cflags=["-O3"],
    verbose=True,
)


def _without_dims(shape, dims):
    """`shape` without the dimensions in `dims` (negative ones count from the end)."""
    drop = {d % len(shape) for d in dims}
    return [size for d, size in enumerate(shape) if d not in drop]


@torch.library.register_fake("popkit_grayscale::grayscale")
def _grayscale_fake(rgb):
    # torch.compile traces with fake tensors: say what the output looks like, without running anything.
    return rgb.new_empty(_without_dims(rgb.shape, (-1,)), dtype=torch.float32)


def custom_kernel(data):
    """data: rgb (float32); returns a new float32 tensor: rgb without dims [-1]."""
    rgb = data
    return torch.ops.popkit_grayscale.grayscale(rgb)
