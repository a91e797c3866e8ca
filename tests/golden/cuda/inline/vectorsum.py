#!POPCORN leaderboard vectorsum
#!POPCORN gpu H100
#
# vectorsum: a simple, correct CUDA kernel, rendered by `popkit new` (style: inline)
# from vectorsum/kernel.yml.
# The extension builds once, when this module is imported; custom_kernel(data) is the entry point.
# Check the build with `popkit compile FILE`, the output with `popkit test FILE`.

import torch
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <torch/types.h>
#include <cmath>
#include <cstdint>

// Tree reduction in shared memory over a block whose size is a power of two. It does not depend
// on the warp width, so the same code is right for 32-lane warps and 64-lane wavefronts. Every
// thread gets the result.
struct SumOp { __device__ float operator()(float a, float b) const { return a + b; } };
struct MaxOp { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };
struct MinOp { __device__ float operator()(float a, float b) const { return fminf(a, b); } };

template <typename Op>
__device__ float block_reduce(float value, float* smem, Op op) {
    smem[threadIdx.x] = value;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) smem[threadIdx.x] = op(smem[threadIdx.x], smem[threadIdx.x + s]);
        __syncthreads();
    }
    const float result = smem[0];
    __syncthreads();  // smem is reused by the next reduction
    return result;
}

__global__ void vectorsum_kernel(const float* __restrict__ x,
                                 float* __restrict__ total,
                                 int64_t n) {
    // Each block reduces its grid-stride share; thread 0 then combines the block's result.
    __shared__ float smem[256];
    float block_sum = 0.0f;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        block_sum += x[i];
    }
    block_sum = block_reduce(block_sum, smem, SumOp());
    if (threadIdx.x == 0) {
        atomicAdd(total, block_sum);
    }
}

torch::Tensor vectorsum(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "vectorsum: `x` must be a GPU tensor");
    TORCH_CHECK(x.scalar_type() == at::kFloat, "vectorsum: `x` must be float32, got ", x.scalar_type());
    x = x.contiguous();
    const int64_t n = x.numel();
    torch::Tensor total = torch::zeros(at::IntArrayRef{}, x.options().dtype(at::kFloat));
    if (n > 0) {
        const dim3 block(256);
        const dim3 grid(static_cast<unsigned int>(std::min<int64_t>((n + 255) / 256, 1024)));
        vectorsum_kernel<<<grid, block>>>(static_cast<const float*>(x.data_ptr()),
                                          static_cast<float*>(total.data_ptr()),
                                          n);
        const cudaError_t err = cudaGetLastError();
        TORCH_CHECK(err == cudaSuccess, "vectorsum_kernel failed to launch: ", cudaGetErrorString(err));
    }
    return total;
}
"""

CPP_SRC = r"""
torch::Tensor vectorsum(torch::Tensor x);
"""

# Built once, at import: the leaderboard's compile step warms the cache for every later process.
_module = load_inline(
    name="popkit_vectorsum_cuda_inline",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["vectorsum"],
    extra_cuda_cflags=["-O3"],
    verbose=True,
)


def custom_kernel(data):
    """data: x (float32); returns a new 0-dim float32 tensor."""
    x = data
    return _module.vectorsum(x)
