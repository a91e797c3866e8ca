#!POPCORN leaderboard vectorsum
#!POPCORN gpu H100
#!POPKIT tune BLOCK=64,128,256,512,1024
#!POPKIT tune VEC=1,2,4,8
#
# vectorsum: a simple, correct CUDA kernel, rendered by `popkit new` (style: library)
# from vectorsum/kernel.yml.
# The extension builds once, when this module is imported; custom_kernel(data) is the entry point.
# Check the build with `popkit compile FILE`, the output with `popkit test FILE`; `popkit tune FILE -o OUT`
# times every launch geometry the `#!POPKIT tune` lines list (all compiled into this one extension) and
# writes OUT with the fastest.

import torch
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <torch/types.h>
#include <torch/library.h>
#include <algorithm>
#include <cmath>
#include <cstdint>

// Block-wide reduction: warp shuffles, then one value per warp through shared memory. Every thread gets the
// result; the trailing barrier lets the next reduction reuse smem.
struct SumOp { __device__ float operator()(float a, float b) const { return a + b; } };
struct MaxOp { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };
struct MinOp { __device__ float operator()(float a, float b) const { return fminf(a, b); } };

template <typename Op>
__device__ float block_reduce(float value, float* smem, Op op) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
    if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = value;
    __syncthreads();
    float result = smem[0];
    for (unsigned int w = 1; w < blockDim.x / 32; ++w) result = op(result, smem[w]);
    __syncthreads();  // smem is reused by the next reduction
    return result;
}

// The launch geometry (BLOCK, VEC) is a template parameter: each grid point is its own kernel.
template <int BLOCK, int VEC>
__global__ void __launch_bounds__(BLOCK) vectorsum_kernel(const float* __restrict__ x,
                                                          float* __restrict__ total,
                                                          int64_t n) {
    // Each block reduces its grid-stride share, VEC elements per thread per step (BLOCK apart, coalesced);
    // thread 0 then combines the block's result.
    __shared__ float smem[BLOCK];
    float block_sum = 0.0f;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * BLOCK * VEC;
    for (int64_t base = static_cast<int64_t>(blockIdx.x) * BLOCK * VEC + threadIdx.x; base < n; base += stride) {
#pragma unroll
        for (int v = 0; v < VEC; ++v) {
            const int64_t i = base + static_cast<int64_t>(v) * BLOCK;
            if (i < n) {
                block_sum += x[i];
            }
        }
    }
    block_sum = block_reduce(block_sum, smem, SumOp());
    if (threadIdx.x == 0) {
        atomicAdd(total, block_sum);
    }
}

// One grid point's launch.
template <int BLOCK, int VEC>
cudaError_t vectorsum_launch(const float* __restrict__ x,
                             float* __restrict__ total,
                             int64_t n) {
    const dim3 block(BLOCK);
    const dim3 grid(static_cast<unsigned int>(std::min<int64_t>((n + BLOCK * VEC - 1) / (BLOCK * VEC), 1024)));
    vectorsum_kernel<BLOCK, VEC><<<grid, block>>>(x, total, n);
    return cudaGetLastError();
}

// Every point of the `#!POPKIT tune` grid is compiled here, so the source is the same whatever values the
// Python file passes, and all the variants `popkit tune` times share this one build. false: not a grid point.
bool vectorsum_dispatch(int64_t BLOCK, int64_t VEC, cudaError_t* err,
                        const float* __restrict__ x,
                        float* __restrict__ total,
                        int64_t n) {
    if (BLOCK == 64 && VEC == 1) { *err = vectorsum_launch<64, 1>(x, total, n); return true; }
    if (BLOCK == 64 && VEC == 2) { *err = vectorsum_launch<64, 2>(x, total, n); return true; }
    if (BLOCK == 64 && VEC == 4) { *err = vectorsum_launch<64, 4>(x, total, n); return true; }
    if (BLOCK == 64 && VEC == 8) { *err = vectorsum_launch<64, 8>(x, total, n); return true; }
    if (BLOCK == 128 && VEC == 1) { *err = vectorsum_launch<128, 1>(x, total, n); return true; }
    if (BLOCK == 128 && VEC == 2) { *err = vectorsum_launch<128, 2>(x, total, n); return true; }
    if (BLOCK == 128 && VEC == 4) { *err = vectorsum_launch<128, 4>(x, total, n); return true; }
    if (BLOCK == 128 && VEC == 8) { *err = vectorsum_launch<128, 8>(x, total, n); return true; }
    if (BLOCK == 256 && VEC == 1) { *err = vectorsum_launch<256, 1>(x, total, n); return true; }
    if (BLOCK == 256 && VEC == 2) { *err = vectorsum_launch<256, 2>(x, total, n); return true; }
    if (BLOCK == 256 && VEC == 4) { *err = vectorsum_launch<256, 4>(x, total, n); return true; }
    if (BLOCK == 256 && VEC == 8) { *err = vectorsum_launch<256, 8>(x, total, n); return true; }
    if (BLOCK == 512 && VEC == 1) { *err = vectorsum_launch<512, 1>(x, total, n); return true; }
    if (BLOCK == 512 && VEC == 2) { *err = vectorsum_launch<512, 2>(x, total, n); return true; }
    if (BLOCK == 512 && VEC == 4) { *err = vectorsum_launch<512, 4>(x, total, n); return true; }
    if (BLOCK == 512 && VEC == 8) { *err = vectorsum_launch<512, 8>(x, total, n); return true; }
    if (BLOCK == 1024 && VEC == 1) { *err = vectorsum_launch<1024, 1>(x, total, n); return true; }
    if (BLOCK == 1024 && VEC == 2) { *err = vectorsum_launch<1024, 2>(x, total, n); return true; }
    if (BLOCK == 1024 && VEC == 4) { *err = vectorsum_launch<1024, 4>(x, total, n); return true; }
    if (BLOCK == 1024 && VEC == 8) { *err = vectorsum_launch<1024, 8>(x, total, n); return true; }
    return false;
}

torch::Tensor vectorsum(torch::Tensor x, int64_t BLOCK, int64_t VEC) {
    TORCH_CHECK(x.is_cuda(), "vectorsum: `x` must be a GPU tensor");
    TORCH_CHECK(x.scalar_type() == at::kFloat, "vectorsum: `x` must be float32, got ", x.scalar_type());
    x = x.contiguous();
    const int64_t n = x.numel();
    torch::Tensor total = torch::zeros(at::IntArrayRef{}, x.options().dtype(at::kFloat));
    if (n > 0) {
        cudaError_t err = cudaSuccess;
        const bool found = vectorsum_dispatch(BLOCK, VEC, &err,
                                              static_cast<const float*>(x.data_ptr()),
                                              static_cast<float*>(total.data_ptr()),
                                              n);
        TORCH_CHECK(found, "vectorsum: no kernel compiled for BLOCK=", BLOCK, ", VEC=", VEC, ": the `#!POPKIT tune` lines list the values compiled");
        TORCH_CHECK(err == cudaSuccess, "vectorsum_kernel failed to launch: ", cudaGetErrorString(err));
    }
    return total;
}

TORCH_LIBRARY_IMPL(popkit_vectorsum, CUDA, m) {
    m.impl("vectorsum", &vectorsum);
}
"""

CPP_SRC = r"""
#include <torch/library.h>

TORCH_LIBRARY(popkit_vectorsum, m) {
    m.def("vectorsum(Tensor x, int BLOCK, int VEC) -> Tensor");
}
"""

# The source registers the operator popkit_vectorsum::vectorsum: its schema in TORCH_LIBRARY (C++ source),
# its GPU implementation in TORCH_LIBRARY_IMPL (kernel source). is_python_module=False loads the
# built library into this process, which runs both registrations.
load_inline(
    name="popkit_vectorsum_cuda_library",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    is_python_module=False,
    extra_cuda_cflags=["-O3"],
    verbose=True,
)


@torch.library.register_fake("popkit_vectorsum::vectorsum")
def _vectorsum_fake(x, BLOCK, VEC):
    # torch.compile traces with fake tensors: say what the output looks like, without running anything.
    return x.new_empty((), dtype=torch.float32)


# The launch geometry, passed to the kernel at every call (`popkit tune` rewrites these values).
BLOCK = 256  # threads per block
VEC = 1  # elements per thread per step, BLOCK apart (loads stay coalesced)


def custom_kernel(data):
    """data: x (float32); returns a new 0-dim float32 tensor."""
    x = data
    return torch.ops.popkit_vectorsum.vectorsum(x, BLOCK, VEC)
