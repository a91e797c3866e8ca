#!POPCORN leaderboard identity
#!POPCORN gpu H100
#!POPKIT tune BLOCK=64,128,256,512,1024
#!POPKIT tune VEC=1,2,4,8
#
# identity: a simple, correct CUDA kernel, rendered by `popkit new` (style: inline)
# from identity/kernel.yml.
# The extension builds once, when this module is imported; custom_kernel(data) is the entry point.
# Check the build with `popkit compile FILE`, the output with `popkit test FILE`; `popkit tune FILE -o OUT`
# times every launch geometry the `#!POPKIT tune` lines list (all compiled into this one extension) and
# writes OUT with the fastest.

import torch
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <torch/types.h>
#include <algorithm>
#include <cmath>
#include <cstdint>

// The launch geometry (BLOCK, VEC) is a template parameter: each grid point is its own kernel.
template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK) identity_kernel(const float* __restrict__ x,
                                                         float* __restrict__ output,
                                                         int64_t n) {
    // A block covers BLOCK * VEC elements: thread t takes t, t + BLOCK, ... (VEC of them, so every load stays
    // coalesced); the grid-stride loop covers sizes beyond the grid.
    const int64_t stride = static_cast<int64_t>(gridDim.x) * BLOCK * VEC;
    for (int64_t base = static_cast<int64_t>(blockIdx.x) * BLOCK * VEC + threadIdx.x; base < n; base += stride) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const int64_t i = base + static_cast<int64_t>(v) * BLOCK;
            if (i < n) {
                output[i] = x[i];
            }
        }
    }
}

// One grid point's launch.
template <int BLOCK, int VEC>
cudaError_t identity_launch(const float* __restrict__ x,
                            float* __restrict__ output,
                            int64_t n) {
    const dim3 block(BLOCK);
    const dim3 grid(static_cast<unsigned int>(std::min<int64_t>((n + BLOCK * VEC - 1) / (BLOCK * VEC), 65536)));
    identity_kernel<BLOCK, VEC><<<grid, block>>>(x, output, n);
    return cudaGetLastError();
}

// Every point of the `#!POPKIT tune` grid is compiled here, so the source is the same whatever values the
// Python file passes, and all the variants `popkit tune` times share this one build. false: not a grid point.
bool identity_dispatch(int64_t BLOCK, int64_t VEC, cudaError_t* err,
                       const float* __restrict__ x,
                       float* __restrict__ output,
                       int64_t n) {
    if (BLOCK == 64 && VEC == 1) { *err = identity_launch<64, 1>(x, output, n); return true; }
    if (BLOCK == 64 && VEC == 2) { *err = identity_launch<64, 2>(x, output, n); return true; }
    if (BLOCK == 64 && VEC == 4) { *err = identity_launch<64, 4>(x, output, n); return true; }
    if (BLOCK == 64 && VEC == 8) { *err = identity_launch<64, 8>(x, output, n); return true; }
    if (BLOCK == 128 && VEC == 1) { *err = identity_launch<128, 1>(x, output, n); return true; }
    if (BLOCK == 128 && VEC == 2) { *err = identity_launch<128, 2>(x, output, n); return true; }
    if (BLOCK == 128 && VEC == 4) { *err = identity_launch<128, 4>(x, output, n); return true; }
    if (BLOCK == 128 && VEC == 8) { *err = identity_launch<128, 8>(x, output, n); return true; }
    if (BLOCK == 256 && VEC == 1) { *err = identity_launch<256, 1>(x, output, n); return true; }
    if (BLOCK == 256 && VEC == 2) { *err = identity_launch<256, 2>(x, output, n); return true; }
    if (BLOCK == 256 && VEC == 4) { *err = identity_launch<256, 4>(x, output, n); return true; }
    if (BLOCK == 256 && VEC == 8) { *err = identity_launch<256, 8>(x, output, n); return true; }
    if (BLOCK == 512 && VEC == 1) { *err = identity_launch<512, 1>(x, output, n); return true; }
    if (BLOCK == 512 && VEC == 2) { *err = identity_launch<512, 2>(x, output, n); return true; }
    if (BLOCK == 512 && VEC == 4) { *err = identity_launch<512, 4>(x, output, n); return true; }
    if (BLOCK == 512 && VEC == 8) { *err = identity_launch<512, 8>(x, output, n); return true; }
    if (BLOCK == 1024 && VEC == 1) { *err = identity_launch<1024, 1>(x, output, n); return true; }
    if (BLOCK == 1024 && VEC == 2) { *err = identity_launch<1024, 2>(x, output, n); return true; }
    if (BLOCK == 1024 && VEC == 4) { *err = identity_launch<1024, 4>(x, output, n); return true; }
    if (BLOCK == 1024 && VEC == 8) { *err = identity_launch<1024, 8>(x, output, n); return true; }
    return false;
}

void identity(torch::Tensor x, torch::Tensor output, int64_t BLOCK, int64_t VEC) {
    TORCH_CHECK(x.is_cuda(), "identity: `x` must be a GPU tensor");
    TORCH_CHECK(x.scalar_type() == at::kFloat, "identity: `x` must be float32, got ", x.scalar_type());
    x = x.contiguous();
    TORCH_CHECK(output.is_cuda(), "identity: `output` must be a GPU tensor");
    TORCH_CHECK(output.scalar_type() == at::kFloat, "identity: `output` must be float32, got ", output.scalar_type());
    TORCH_CHECK(output.is_contiguous(), "identity: `output` must be contiguous (the kernel writes it in place)");
    TORCH_CHECK(output.numel() == x.numel(), "identity: `output` and `x` must have the same number of elements");
    const int64_t n = x.numel();
    if (n > 0) {
        cudaError_t err = cudaSuccess;
        const bool found = identity_dispatch(BLOCK, VEC, &err,
                                             static_cast<const float*>(x.data_ptr()),
                                             static_cast<float*>(output.data_ptr()),
                                             n);
        TORCH_CHECK(found, "identity: no kernel compiled for BLOCK=", BLOCK, ", VEC=", VEC, ": the `#!POPKIT tune` lines list the values compiled");
        TORCH_CHECK(err == cudaSuccess, "identity_kernel failed to launch: ", cudaGetErrorString(err));
    }
}
"""

CPP_SRC = r"""
void identity(torch::Tensor x, torch::Tensor output, int64_t BLOCK, int64_t VEC);
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


# The launch geometry, passed to the kernel at every call (`popkit tune` rewrites these values).
BLOCK = 256  # threads per block
VEC = 1  # elements per thread per step, BLOCK apart (loads stay coalesced)


def custom_kernel(data):
    """data: (x (float32), output (float32)); returns output, filled in place."""
    x, output = data
    _module.identity(x, output, BLOCK, VEC)
    return output
