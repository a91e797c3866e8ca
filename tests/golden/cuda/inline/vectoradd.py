#!POPCORN leaderboard vectoradd
#!POPCORN gpu H100
#!POPKIT tune BLOCK=64,128,256,512,1024
#!POPKIT tune VEC=1,2,4,8
#
# vectoradd: a simple, correct CUDA kernel, rendered by `popkit new` (style: inline)
# from vectoradd/kernel.yml.
# The extension builds once, when this module is imported; custom_kernel(data) is the entry point.
# Check the build with `popkit compile FILE`, the output with `popkit test FILE`; `popkit tune FILE -o OUT`
# times every launch geometry the `#!POPKIT tune` lines list (all compiled into this one extension) and
# writes OUT with the fastest.

import torch
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <torch/types.h>
#include <algorithm>
#include <cmath>
#include <cstdint>

// The launch geometry (BLOCK, VEC) is a template parameter: each grid point is its own kernel.
template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK) vectoradd_kernel(const __half* __restrict__ a,
                                                          const __half* __restrict__ b,
                                                          __half* __restrict__ out,
                                                          int64_t n) {
    // A block covers BLOCK * VEC elements: thread t takes t, t + BLOCK, ... (VEC of them, so every load stays
    // coalesced); the grid-stride loop covers sizes beyond the grid.
    const int64_t stride = static_cast<int64_t>(gridDim.x) * BLOCK * VEC;
    for (int64_t base = static_cast<int64_t>(blockIdx.x) * BLOCK * VEC + threadIdx.x; base < n; base += stride) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const int64_t i = base + static_cast<int64_t>(v) * BLOCK;
            if (i < n) {
                out[i] = __hadd(a[i], b[i]);
            }
        }
    }
}

// One grid point's launch.
template <int BLOCK, int VEC>
cudaError_t vectoradd_launch(const __half* __restrict__ a,
                             const __half* __restrict__ b,
                             __half* __restrict__ out,
                             int64_t n) {
    const dim3 block(BLOCK);
    const dim3 grid(static_cast<unsigned int>(std::min<int64_t>((n + BLOCK * VEC - 1) / (BLOCK * VEC), 65536)));
    vectoradd_kernel<BLOCK, VEC><<<grid, block>>>(a, b, out, n);
    return cudaGetLastError();
}

// Every point of the `#!POPKIT tune` grid is compiled here, so the source is the same whatever values the
// Python file passes, and all the variants `popkit tune` times share this one build. false: not a grid point.
bool vectoradd_dispatch(int64_t BLOCK, int64_t VEC, cudaError_t* err,
                        const __half* __restrict__ a,
                        const __half* __restrict__ b,
                        __half* __restrict__ out,
                        int64_t n) {
    if (BLOCK == 64 && VEC == 1) { *err = vectoradd_launch<64, 1>(a, b, out, n); return true; }
    if (BLOCK == 64 && VEC == 2) { *err = vectoradd_launch<64, 2>(a, b, out, n); return true; }
    if (BLOCK == 64 && VEC == 4) { *err = vectoradd_launch<64, 4>(a, b, out, n); return true; }
    if (BLOCK == 64 && VEC == 8) { *err = vectoradd_launch<64, 8>(a, b, out, n); return true; }
    if (BLOCK == 128 && VEC == 1) { *err = vectoradd_launch<128, 1>(a, b, out, n); return true; }
    if (BLOCK == 128 && VEC == 2) { *err = vectoradd_launch<128, 2>(a, b, out, n); return true; }
    if (BLOCK == 128 && VEC == 4) { *err = vectoradd_launch<128, 4>(a, b, out, n); return true; }
    if (BLOCK == 128 && VEC == 8) { *err = vectoradd_launch<128, 8>(a, b, out, n); return true; }
    if (BLOCK == 256 && VEC == 1) { *err = vectoradd_launch<256, 1>(a, b, out, n); return true; }
    if (BLOCK == 256 && VEC == 2) { *err = vectoradd_launch<256, 2>(a, b, out, n); return true; }
    if (BLOCK == 256 && VEC == 4) { *err = vectoradd_launch<256, 4>(a, b, out, n); return true; }
    if (BLOCK == 256 && VEC == 8) { *err = vectoradd_launch<256, 8>(a, b, out, n); return true; }
    if (BLOCK == 512 && VEC == 1) { *err = vectoradd_launch<512, 1>(a, b, out, n); return true; }
    if (BLOCK == 512 && VEC == 2) { *err = vectoradd_launch<512, 2>(a, b, out, n); return true; }
    if (BLOCK == 512 && VEC == 4) { *err = vectoradd_launch<512, 4>(a, b, out, n); return true; }
    if (BLOCK == 512 && VEC == 8) { *err = vectoradd_launch<512, 8>(a, b, out, n); return true; }
    if (BLOCK == 1024 && VEC == 1) { *err = vectoradd_launch<1024, 1>(a, b, out, n); return true; }
    if (BLOCK == 1024 && VEC == 2) { *err = vectoradd_launch<1024, 2>(a, b, out, n); return true; }
    if (BLOCK == 1024 && VEC == 4) { *err = vectoradd_launch<1024, 4>(a, b, out, n); return true; }
    if (BLOCK == 1024 && VEC == 8) { *err = vectoradd_launch<1024, 8>(a, b, out, n); return true; }
    return false;
}

torch::Tensor vectoradd(torch::Tensor a, torch::Tensor b, int64_t BLOCK, int64_t VEC) {
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
        cudaError_t err = cudaSuccess;
        const bool found = vectoradd_dispatch(BLOCK, VEC, &err,
                                              static_cast<const __half*>(a.data_ptr()),
                                              static_cast<const __half*>(b.data_ptr()),
                                              static_cast<__half*>(out.data_ptr()),
                                              n);
        TORCH_CHECK(found, "vectoradd: no kernel compiled for BLOCK=", BLOCK, ", VEC=", VEC, ": the `#!POPKIT tune` lines list the values compiled");
        TORCH_CHECK(err == cudaSuccess, "vectoradd_kernel failed to launch: ", cudaGetErrorString(err));
    }
    return out;
}
"""

CPP_SRC = r"""
torch::Tensor vectoradd(torch::Tensor a, torch::Tensor b, int64_t BLOCK, int64_t VEC);
"""

# Built once, at import: the leaderboard's compile step warms the cache for every later process.
_module = load_inline(
    name="popkit_vectoradd_cuda_inline",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["vectoradd"],
    extra_cuda_cflags=["-O3"],
    verbose=True,
)


# The launch geometry, passed to the kernel at every call (`popkit tune` rewrites these values).
BLOCK = 256  # threads per block
VEC = 1  # elements per thread per step, BLOCK apart (loads stay coalesced)


def custom_kernel(data):
    """data: (a (float16), b (float16)); returns a new float16 tensor shaped like a."""
    a, b = data
    return _module.vectoradd(a, b, BLOCK, VEC)
