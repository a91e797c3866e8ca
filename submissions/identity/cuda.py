#!POPCORN leaderboard identity
#!POPCORN gpu H100

# Identity as a CUDA kernel: copy a float32 vector into the buffer the harness preallocated.
#
# A copy is purely memory bound: 8 bytes move per element (4 read, 4 written) and there is no
# arithmetic, so the goal is the GPU's copy bandwidth (about 3 TB/s read+write on an H100 SXM,
# i.e. roughly 180 us for the ranked 67,108,864-element case). What gets you there:
#   * 16-byte accesses (float4): a quarter of the load/store instructions of a scalar copy, and
#     each warp instruction touches 512 contiguous bytes.
#   * Several independent loads in flight per thread (UNROLL) before any store, so the memory
#     system always has enough outstanding requests to hide DRAM latency.
#   * A scalar head and tail: float4 accesses need 16-byte aligned addresses, and `size` is
#     often not a multiple of 4. Torch allocations are 256-byte aligned, but a view into a bigger
#     tensor may start anywhere, so the kernel peels up to 3 head elements to reach alignment
#     (only possible when input and output are equally misaligned; otherwise it copies scalars).
#   * 64-bit indices: sizes past 2^31 elements exist on 80 GB cards.
#
# Measured on an H100 80GB HBM3 (L2 flushed before each call, as the harness does): 184 us for
# the ranked case (2.9 TB/s), level with torch's `copy_` (182 us). A copy has nothing left to gain.

import torch
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <cstdint>

constexpr int THREADS = 256;
constexpr int UNROLL = 4;  // float4 loads issued per thread before its stores

// Copies n_vec float4 starting at element `head`, plus the scalar head [0, head) and the scalar
// tail [head + 4 * n_vec, n). Block b owns THREADS * UNROLL consecutive float4; within one unroll
// step consecutive threads touch consecutive float4, so every warp access is fully coalesced.
__global__ void copy_kernel(const float* __restrict__ in, float* __restrict__ out,
                            int64_t n, int64_t head, int64_t n_vec) {
    const float4* __restrict__ in4 = reinterpret_cast<const float4*>(in + head);
    float4* __restrict__ out4 = reinterpret_cast<float4*>(out + head);

    const int64_t base = static_cast<int64_t>(blockIdx.x) * THREADS * UNROLL + threadIdx.x;
    float4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int64_t i = base + static_cast<int64_t>(u) * THREADS;
        if (i < n_vec) v[u] = in4[i];
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int64_t i = base + static_cast<int64_t>(u) * THREADS;
        if (i < n_vec) out4[i] = v[u];
    }

    // The scalar leftovers (at most 3 at each end) go to the first threads of block 0.
    if (blockIdx.x == 0) {
        const int64_t tail_start = head + 4 * n_vec;
        if (threadIdx.x < head) out[threadIdx.x] = in[threadIdx.x];
        if (threadIdx.x < n - tail_start) out[tail_start + threadIdx.x] = in[tail_start + threadIdx.x];
    }
}

// Fallback when input and output are misaligned with respect to each other: no common offset
// makes both 16-byte aligned, so copy one float per thread with a grid-stride loop.
__global__ void copy_scalar_kernel(const float* __restrict__ in, float* __restrict__ out, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = in[i];
    }
}

torch::Tensor identity(torch::Tensor input, torch::Tensor output) {
    TORCH_CHECK(input.is_cuda() && output.is_cuda(), "identity: tensors must be on the GPU");
    TORCH_CHECK(input.scalar_type() == torch::kFloat32 && output.scalar_type() == torch::kFloat32,
                "identity: tensors must be float32");
    TORCH_CHECK(input.is_contiguous() && output.is_contiguous(), "identity: tensors must be contiguous");
    TORCH_CHECK(input.numel() == output.numel(), "identity: sizes differ");
    const int64_t n = input.numel();
    if (n == 0) return output;

    const float* in = input.data_ptr<float>();
    float* out = output.data_ptr<float>();
    const auto in_addr = reinterpret_cast<std::uintptr_t>(in);
    const auto out_addr = reinterpret_cast<std::uintptr_t>(out);

    if (in_addr % 16 == out_addr % 16) {
        // Elements to skip until both pointers sit on a 16-byte boundary (0 for fresh tensors).
        const int64_t head = std::min<int64_t>(n, ((16 - in_addr % 16) % 16) / sizeof(float));
        const int64_t n_vec = (n - head) / 4;
        const int64_t per_block = static_cast<int64_t>(THREADS) * UNROLL;
        // At least one block so that block 0 exists to copy the head and tail.
        const int64_t blocks = std::max<int64_t>(1, (n_vec + per_block - 1) / per_block);
        copy_kernel<<<static_cast<unsigned int>(blocks), THREADS>>>(in, out, n, head, n_vec);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else {
        const int64_t blocks = std::min<int64_t>((n + THREADS - 1) / THREADS, 65536);
        copy_scalar_kernel<<<static_cast<unsigned int>(blocks), THREADS>>>(in, out, n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    return output;
}
"""

CPP_SRC = "torch::Tensor identity(torch::Tensor input, torch::Tensor output);"

# Compiled once when the module is imported; the build is cached on disk, so later imports
# (the harness imports this file again) only load the shared library.
_module = load_inline(
    name="popkit_identity_cuda",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["identity"],
    extra_cuda_cflags=["-O3"],
    verbose=True,
)


def custom_kernel(data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, out = data
    return _module.identity(x, out)
