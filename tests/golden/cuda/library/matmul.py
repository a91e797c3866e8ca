#!POPCORN leaderboard matmul
#!POPCORN gpu H100
#
# matmul: a simple, correct CUDA kernel, rendered by `popkit new` (style: library)
# from matmul/kernel.yml.
# The extension builds once, when this module is imported; custom_kernel(data) is the entry point.
# Check the build with `popkit compile FILE`, the output with `popkit test FILE`.

import torch
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <torch/types.h>
#include <torch/library.h>
#include <cmath>
#include <cstdint>

__global__ void matmul_kernel(const __half* __restrict__ a,
                              const __half* __restrict__ b,
                              __half* __restrict__ c,
                              int64_t m,
                              int64_t n,
                              int64_t k) {
    // One thread per output element; 16x16 tiles of a and b pass through shared
    // memory along k, accumulating in float32.
    __shared__ float tile_a[16][16];
    __shared__ float tile_b[16][16];
    const int64_t row = static_cast<int64_t>(blockIdx.y) * 16 + threadIdx.y;
    const int64_t col = static_cast<int64_t>(blockIdx.x) * 16 + threadIdx.x;
    float acc = 0.0f;
    for (int64_t k0 = 0; k0 < k; k0 += 16) {
        const int64_t ak = k0 + threadIdx.x;
        const int64_t bk = k0 + threadIdx.y;
        tile_a[threadIdx.y][threadIdx.x] = (row < m && ak < k) ? __half2float(a[row * k + ak]) : 0.0f;
        tile_b[threadIdx.y][threadIdx.x] = (bk < k && col < n) ? __half2float(b[bk * n + col]) : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 16; ++kk) acc += tile_a[threadIdx.y][kk] * tile_b[kk][threadIdx.x];
        __syncthreads();
    }
    if (row < m && col < n) {
        c[row * n + col] = __float2half(acc);
    }
}

torch::Tensor matmul(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda(), "matmul: `a` must be a GPU tensor");
    TORCH_CHECK(a.scalar_type() == at::kHalf, "matmul: `a` must be float16, got ", a.scalar_type());
    a = a.contiguous();
    TORCH_CHECK(b.is_cuda(), "matmul: `b` must be a GPU tensor");
    TORCH_CHECK(b.scalar_type() == at::kHalf, "matmul: `b` must be float16, got ", b.scalar_type());
    b = b.contiguous();
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "matmul: expected `a` (m, k) and `b` (k, n), got ", a.sizes(), " and ", b.sizes());
    const int64_t m = a.size(0);
    const int64_t k = a.size(1);
    const int64_t n = b.size(1);
    torch::Tensor c = torch::empty({a.size(0), b.size(1)}, a.options().dtype(at::kHalf));
    if (m > 0 && n > 0) {
        const dim3 block(16, 16);
        const dim3 grid(static_cast<unsigned int>((n + 15) / 16), static_cast<unsigned int>((m + 15) / 16));
        matmul_kernel<<<grid, block>>>(static_cast<const __half*>(a.data_ptr()),
                                       static_cast<const __half*>(b.data_ptr()),
                                       static_cast<__half*>(c.data_ptr()),
                                       m,
                                       n,
                                       k);
        const cudaError_t err = cudaGetLastError();
        TORCH_CHECK(err == cudaSuccess, "matmul_kernel failed to launch: ", cudaGetErrorString(err));
    }
    return c;
}

TORCH_LIBRARY_IMPL(popkit_matmul, CUDA, m) {
    m.impl("matmul", &matmul);
}
"""

CPP_SRC = r"""
#include <torch/library.h>

TORCH_LIBRARY(popkit_matmul, m) {
    m.def("matmul(Tensor a, Tensor b) -> Tensor");
}
"""

# The source registers the operator popkit_matmul::matmul: its schema in TORCH_LIBRARY (C++ source),
# its GPU implementation in TORCH_LIBRARY_IMPL (kernel source). is_python_module=False loads the
# built library into this process, which runs both registrations.
load_inline(
    name="popkit_matmul_cuda_library",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    is_python_module=False,
    extra_cuda_cflags=["-O3"],
    verbose=True,
)


@torch.library.register_fake("popkit_matmul::matmul")
def _matmul_fake(a, b):
    # torch.compile traces with fake tensors: say what the output looks like, without running anything.
    return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.float16)


def custom_kernel(data):
    """data: (a (float16), b (float16)); returns a new float16 tensor of shape (a.size(0), b.size(1))."""
    a, b = data
    return torch.ops.popkit_matmul.matmul(a, b)
