#!POPCORN leaderboard identity
#!POPCORN gpu H100
#
# identity: a simple, correct CUDA kernel, rendered by `popkit new` (style: inline)
# from identity/kernel.yml.
# The extension builds once, when this module is imported; custom_kernel(data) is the entry point.
# Check the build with `popkit compile FILE`, the output with `popkit test FILE`.

import torch
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <torch/types.h>
#include <cmath>
#include <cstdint>

__global__ void identity_kernel(const float* __restrict__ x,
                                float* __restrict__ output,
                                int64_t n) {
    // One element per thread; the grid-stride loop covers sizes beyond the grid.
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        output[i] = x[i];
    }
}

void identity(torch::Tensor x, torch::Tensor output) {
    TORCH_CHECK(x.is_cuda(), "identity: `x` must be a GPU tensor");
    TORCH_CHECK(x.scalar_type() == at::kFloat, "identity: `x` must be float32, got ", x.scalar_type());
    x = x.contiguous();
    TORCH_CHECK(output.is_cuda(), "identity: `output` must be a GPU tensor");
    TORCH_CHECK(output.scalar_type() == at::kFloat, "identity: `output` must be float32, got ", output.scalar_type());
    TORCH_CHECK(output.is_contiguous(), "identity: `output` must be contiguous (the kernel writes it in place)");
    TORCH_CHECK(output.numel() == x.numel(), "identity: `output` and `x` must have the same number of elements");
    const int64_t n = x.numel();
    if (n > 0) {
        const dim3 block(256);
        const dim3 grid(static_cast<unsigned int>(std::min<int64_t>((n + 255) / 256, 65536)));
        identity_kernel<<<grid, block>>>(static_cast<const float*>(x.data_ptr()),
                                         static_cast<float*>(output.data_ptr()),
                                         n);
        const cudaError_t err = cudaGetLastError();
        TORCH_CHECK(err == cudaSuccess, "identity_kernel failed to launch: ", cudaGetErrorString(err));
    }
}
"""

CPP_SRC = r"""
void identity(torch::Tensor x, torch::Tensor output);
"""

# Built once, at import: the leaderboard's compile step warms the cache for every later process.
_module = load_inline(
    name="popkit_identity_cuda_inline",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["identity"],
    extra_cuda_cflags=["-O3"],
    verbose=True,
)


def custom_kernel(data):
    """data: (x (float32), output (float32)); returns output, filled in place."""
    x, output = data
    _module.identity(x, output)
    return output
