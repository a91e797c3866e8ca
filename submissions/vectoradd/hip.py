#!POPCORN leaderboard vectoradd
#!POPCORN gpu MI300

# Vector addition of two float16 matrices as a HIP kernel for AMD Instinct MI300 (gfx942).
#
# Memory bound (6 bytes per element), so the plan is the CUDA example's: 16-byte accesses of
# eight halves (global_load_dwordx4), packed __half2 adds, several loads in flight per thread, a
# scalar head/tail for element counts that are not a multiple of 8, and 64-bit indices.
# At MI300X's ~5.3 TB/s the 8192x8192 case (384 MiB) can take about 80-90 us.
#
# The compiler and target must be in the environment before torch is imported.

import os

os.environ["PYTORCH_ROCM_ARCH"] = "gfx942"
os.environ["CXX"] = "clang++"

import torch  # noqa: E402  (must come after the environment is set)
from torch.utils.cpp_extension import load_inline  # noqa: E402

# The kernels alone, no torch header: `popkit compile` builds them for gfx942 on any machine with
# clang, and `popkit test --hip-on-cuda` runs them on an NVIDIA GPU.
DEVICE_SRC = r"""
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#include <cstdint>

constexpr int THREADS = 256;
constexpr int UNROLL = 4;

// Eight halves in one 16-byte-aligned group: one dwordx4 load or store.
struct alignas(16) Half8 {
    __half2 h[4];
};

// Adds n_vec groups of eight starting at element `head`; the first threads of block 0 add the
// scalar head [0, head) and the scalar tail [head + 8 * n_vec, n).
__global__ void add_kernel(const __half* __restrict__ a, const __half* __restrict__ b,
                           __half* __restrict__ out, int64_t n, int64_t head, int64_t n_vec) {
    const Half8* __restrict__ a8 = reinterpret_cast<const Half8*>(a + head);
    const Half8* __restrict__ b8 = reinterpret_cast<const Half8*>(b + head);
    Half8* __restrict__ out8 = reinterpret_cast<Half8*>(out + head);

    const int64_t base = static_cast<int64_t>(blockIdx.x) * THREADS * UNROLL + threadIdx.x;
    Half8 va[UNROLL], vb[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int64_t i = base + static_cast<int64_t>(u) * THREADS;
        if (i < n_vec) {
            va[u] = a8[i];
            vb[u] = b8[i];
        }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int64_t i = base + static_cast<int64_t>(u) * THREADS;
        if (i < n_vec) {
            Half8 r;
#pragma unroll
            for (int j = 0; j < 4; ++j) r.h[j] = __hadd2(va[u].h[j], vb[u].h[j]);
            out8[i] = r;
        }
    }

    if (blockIdx.x == 0) {
        const int64_t t = threadIdx.x;
        const int64_t tail_start = head + 8 * n_vec;
        if (t < head) out[t] = __hadd(a[t], b[t]);
        if (t < n - tail_start) out[tail_start + t] = __hadd(a[tail_start + t], b[tail_start + t]);
    }
}

// Fallback when the three buffers are misaligned with respect to each other.
__global__ void add_scalar_kernel(const __half* __restrict__ a, const __half* __restrict__ b,
                                  __half* __restrict__ out, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = __hadd(a[i], b[i]);
    }
}
"""

# The torch wrapper: checks the tensors and launches the kernels above.
HOST_SRC = r"""
#include <torch/extension.h>

static void check_launch(const char* what) {
    const hipError_t err = hipGetLastError();
    TORCH_CHECK(err == hipSuccess, what, " failed to launch: ", hipGetErrorString(err));
}

torch::Tensor vectoradd(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "vectoradd: tensors must be on the GPU");
    TORCH_CHECK(a.scalar_type() == torch::kHalf && b.scalar_type() == torch::kHalf,
                "vectoradd: tensors must be float16");
    TORCH_CHECK(a.is_contiguous() && b.is_contiguous(), "vectoradd: tensors must be contiguous");
    TORCH_CHECK(a.sizes() == b.sizes(), "vectoradd: shapes differ");
    torch::Tensor out = torch::empty_like(a);
    const int64_t n = a.numel();
    if (n == 0) return out;

    const auto* pa = reinterpret_cast<const __half*>(a.data_ptr<at::Half>());
    const auto* pb = reinterpret_cast<const __half*>(b.data_ptr<at::Half>());
    auto* po = reinterpret_cast<__half*>(out.data_ptr<at::Half>());
    const auto addr_a = reinterpret_cast<std::uintptr_t>(pa);
    const auto addr_b = reinterpret_cast<std::uintptr_t>(pb);
    const auto addr_o = reinterpret_cast<std::uintptr_t>(po);

    if (addr_a % 16 == addr_b % 16 && addr_a % 16 == addr_o % 16) {
        const int64_t head = std::min<int64_t>(n, ((16 - addr_a % 16) % 16) / sizeof(__half));
        const int64_t n_vec = (n - head) / 8;
        const int64_t per_block = static_cast<int64_t>(THREADS) * UNROLL;
        const int64_t blocks = std::max<int64_t>(1, (n_vec + per_block - 1) / per_block);
        add_kernel<<<dim3(static_cast<unsigned int>(blocks)), dim3(THREADS)>>>(pa, pb, po, n, head, n_vec);
        check_launch("add_kernel");
    } else {
        const int64_t blocks = std::min<int64_t>((n + THREADS - 1) / THREADS, 65536);
        add_scalar_kernel<<<dim3(static_cast<unsigned int>(blocks)), dim3(THREADS)>>>(pa, pb, po, n);
        check_launch("add_scalar_kernel");
    }
    return out;
}
"""

# One source for load_inline (and one file for the leaderboard): the kernels, then the wrapper.
HIP_SRC = DEVICE_SRC + HOST_SRC

CPP_SRC = "torch::Tensor vectoradd(torch::Tensor a, torch::Tensor b);"

_module = load_inline(
    name="popkit_vectoradd_hip",
    cpp_sources=CPP_SRC,
    cuda_sources=HIP_SRC,
    functions=["vectoradd"],
    extra_cuda_cflags=["--offload-arch=gfx942", "-std=c++20", "-O3"],
    verbose=True,
)


def custom_kernel(data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    a, b = data
    return _module.vectoradd(a, b)
