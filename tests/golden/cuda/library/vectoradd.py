#!POPCORN leaderboard vectoradd
#!POPCORN gpu H100
#
# vectoradd: a simple, correct CUDA kernel, rendered by `popkit new` (style: library)
# from vectoradd/kernel.yml.
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

__global__ void vectoradd_kernel(const __half* __restrict__ a,
                                 const __half* __restrict__ b,
                                 __half* __restrict__ out,
                                 int64_t n) {
    // One element per thread; the grid-stride loop covers sizes beyond the grid.
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = __hadd(a[i], b[i]);
    }
}

torch::Tensor vectoradd(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda(), "vectoradd: `a` must be a GPU tensor");
    TORCH_CHECK(a.scalar_type() == at::kHalf, "vectoradd: `a` must be float16, got ", a.scalar_type());
    a = a.contiguous();
    TORCH_CHECK(b.is_cuda(), "vectoradd: `b` must be a GPU tensor");
    TORCH_CHECK(b.scalar_type() == at::kHalf, "vectoradd: `b` must be float16, got ", b.scalar_type());
    b = b.contiguous();
    TORCH_CHECK(b.numel() == a.numel(), "vectoradd: `b` and `a` must have the same number of elements");
    const int64_t n = a.numel();
    torch::Tensor out = torch::empty_like(a);
    if (n > 0) {
        const dim3 block(256);
        const dim3 grid(static_cast<unsigned int>(std::min<int64_t>((n + 255) / 256, 65536)));
        vectoradd_kernel<<<grid, block>>>(static_cast<const __half*>(a.data_ptr()),
                                          static_cast<const __half*>(b.data_ptr()),
                                          static_cast<__half*>(out.data_ptr()),
                                          n);
        const cudaError_t err = cudaGetLastError();
        TORCH_CHECK(err == cudaSuccess, "vectoradd_kernel failed to launch: ", cudaGetErrorString(err));
    }
    return out;
}

TORCH_LIBRARY_IMPL(popkit_vectoradd, CUDA, m) {
    m.impl("vectoradd", &vectoradd);
}
"""

CPP_SRC = r"""
#include <torch/library.h>

TORCH_LIBRARY(popkit_vectoradd, m) {
    m.def("vectoradd(Tensor a, Tensor b) -> Tensor");
}
"""

# The source registers the operator popkit_vectoradd::vectoradd: its schema in TORCH_LIBRARY (C++ source),
# its GPU implementation in TORCH_LIBRARY_IMPL (kernel source). is_python_module=False loads the
# built library into this process, which runs both registrations.
load_inline(
    name="popkit_vectoradd_cuda_library",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    is_python_module=False,
    extra_cuda_cflags=["-O3"],
    verbose=True,
)


@torch.library.register_fake("popkit_vectoradd::vectoradd")
def _vectoradd_fake(a, b):
    # torch.compile traces with fake tensors: say what the output looks like, without running anything.
    return torch.empty_like(a)


def custom_kernel(data):
    """data: (a (float16), b (float16)); returns a new float16 tensor shaped like a."""
    a, b = data
    return torch.ops.popkit_vectoradd.vectoradd(a, b)
