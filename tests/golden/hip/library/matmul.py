#!POPCORN leaderboard matmul
#!POPCORN gpu MI300
#!POPKIT tune TILE=8,16,32
#!POPKIT tune WPT=1,2,4,8
#!POPKIT tune-if TILE * TILE // WPT >= 32
#
# matmul: a simple, correct HIP kernel, rendered by `popkit new` (style: library)
# from matmul/kernel.yml.
# The extension builds once, when this module is imported; custom_kernel(data) is the entry point.
# Check the build with `popkit compile FILE`, the output with `popkit test FILE`; `popkit tune FILE -o OUT`
# times every launch geometry the `#!POPKIT tune` lines list (all compiled into this one extension) and
# writes OUT with the fastest.

import os

# The AMD runner builds with clang++ for the architecture named here, and torch reads both when it
# is imported: they must be set before the import.
os.environ["PYTORCH_ROCM_ARCH"] = "gfx942"
os.environ["CXX"] = "clang++"

import torch  # noqa: E402  (after the environment is set)
from torch.utils.cpp_extension import load_inline  # noqa: E402

# The kernels alone (no torch header): `popkit compile` builds this string for the AMD GPU on any
# machine, and `popkit test --hip-on-cuda` runs it on an NVIDIA GPU.
DEVICE_SRC = r"""
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#include <algorithm>
#include <cmath>
#include <cstdint>

// The launch geometry (TILE, WPT) is a template parameter: each grid point is its own kernel.
template <int TILE, int WPT>
__global__ void __launch_bounds__(TILE * TILE / WPT) matmul_kernel(const __half* __restrict__ a,
                                                                   const __half* __restrict__ b,
                                                                   __half* __restrict__ c,
                                                                   int64_t m,
                                                                   int64_t n,
                                                                   int64_t k) {
    // A block computes a TILE x TILE tile of the output with TILE x TILE/WPT threads; a thread computes WPT
    // outputs of one column, TILE/WPT rows apart. TILE x TILE tiles of a and b pass through shared
    // memory along k, accumulating in float32.
    __shared__ float tile_a[TILE][TILE];
    __shared__ float tile_b[TILE][TILE];
    const int64_t col = static_cast<int64_t>(blockIdx.x) * TILE + threadIdx.x;
    float accs[WPT];
#pragma unroll
    for (int w = 0; w < WPT; ++w) accs[w] = 0.0f;
    for (int64_t k0 = 0; k0 < k; k0 += TILE) {
#pragma unroll
        for (int w = 0; w < WPT; ++w) {
            const int ty = threadIdx.y + w * (TILE / WPT);
            const int64_t row = static_cast<int64_t>(blockIdx.y) * TILE + ty;
            const int64_t ak = k0 + threadIdx.x;
            const int64_t bk = k0 + ty;
            tile_a[ty][threadIdx.x] = (row < m && ak < k) ? __half2float(a[row * k + ak]) : 0.0f;
            tile_b[ty][threadIdx.x] = (bk < k && col < n) ? __half2float(b[bk * n + col]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TILE; ++kk) {
            const float bv = tile_b[kk][threadIdx.x];
#pragma unroll
            for (int w = 0; w < WPT; ++w) accs[w] += tile_a[threadIdx.y + w * (TILE / WPT)][kk] * bv;
        }
        __syncthreads();
    }
#pragma unroll
    for (int w = 0; w < WPT; ++w) {
        const int64_t row = static_cast<int64_t>(blockIdx.y) * TILE + threadIdx.y + w * (TILE / WPT);
        const float acc = accs[w];
        if (row < m && col < n) {
            c[row * n + col] = __float2half(acc);
        }
    }
}

// One grid point's launch.
template <int TILE, int WPT>
hipError_t matmul_launch(const __half* __restrict__ a,
                         const __half* __restrict__ b,
                         __half* __restrict__ c,
                         int64_t m,
                         int64_t n,
                         int64_t k) {
    const dim3 block(TILE, TILE / WPT);
    const dim3 grid(static_cast<unsigned int>((n + TILE - 1) / TILE), static_cast<unsigned int>((m + TILE - 1) / TILE));
    matmul_kernel<TILE, WPT><<<grid, block>>>(a, b, c, m, n, k);
    return hipGetLastError();
}

// Every point of the `#!POPKIT tune` grid is compiled here, so the source is the same whatever values the
// Python file passes, and all the variants `popkit tune` times share this one build. false: not a grid point.
bool matmul_dispatch(int64_t TILE, int64_t WPT, hipError_t* err,
                     const __half* __restrict__ a,
                     const __half* __restrict__ b,
                     __half* __restrict__ c,
                     int64_t m,
                     int64_t n,
                     int64_t k) {
    if (TILE == 8 && WPT == 1) { *err = matmul_launch<8, 1>(a, b, c, m, n, k); return true; }
    if (TILE == 8 && WPT == 2) { *err = matmul_launch<8, 2>(a, b, c, m, n, k); return true; }
    if (TILE == 16 && WPT == 1) { *err = matmul_launch<16, 1>(a, b, c, m, n, k); return true; }
    if (TILE == 16 && WPT == 2) { *err = matmul_launch<16, 2>(a, b, c, m, n, k); return true; }
    if (TILE == 16 && WPT == 4) { *err = matmul_launch<16, 4>(a, b, c, m, n, k); return true; }
    if (TILE == 16 && WPT == 8) { *err = matmul_launch<16, 8>(a, b, c, m, n, k); return true; }
    if (TILE == 32 && WPT == 1) { *err = matmul_launch<32, 1>(a, b, c, m, n, k); return true; }
    if (TILE == 32 && WPT == 2) { *err = matmul_launch<32, 2>(a, b, c, m, n, k); return true; }
    if (TILE == 32 && WPT == 4) { *err = matmul_launch<32, 4>(a, b, c, m, n, k); return true; }
    if (TILE == 32 && WPT == 8) { *err = matmul_launch<32, 8>(a, b, c, m, n, k); return true; }
    return false;
}
"""

# The torch wrapper that checks the tensors and launches the kernels above.
HOST_SRC = r"""
#include <torch/types.h>
#include <torch/library.h>

torch::Tensor matmul(torch::Tensor a, torch::Tensor b, int64_t TILE, int64_t WPT) {
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
        hipError_t err = hipSuccess;
        const bool found = matmul_dispatch(TILE, WPT, &err,
                                           static_cast<const __half*>(a.data_ptr()),
                                           static_cast<const __half*>(b.data_ptr()),
                                           static_cast<__half*>(c.data_ptr()),
                                           m,
                                           n,
                                           k);
        TORCH_CHECK(found, "matmul: no kernel compiled for TILE=", TILE, ", WPT=", WPT, ": the `#!POPKIT tune` lines list the values compiled");
        TORCH_CHECK(err == hipSuccess, "matmul_kernel failed to launch: ", hipGetErrorString(err));
    }
    return c;
}

// ROCm builds of torch dispatch AMD GPUs under the CUDA key.
TORCH_LIBRARY_IMPL(popkit_matmul, CUDA, m) {
    m.impl("matmul", &matmul);
}
"""

# The leaderboard gets this one file, and load_inline one source: the kernels, then the wrapper.
HIP_SRC = DEVICE_SRC + HOST_SRC

CPP_SRC = r"""
#include <torch/library.h>

TORCH_LIBRARY(popkit_matmul, m) {
    m.def("matmul(Tensor a, Tensor b, int TILE, int WPT) -> Tensor");
}
"""

# The source registers the operator popkit_matmul::matmul: its schema in TORCH_LIBRARY (C++ source),
# its GPU implementation in TORCH_LIBRARY_IMPL (kernel source). is_python_module=False loads the
# built library into this process, which runs both registrations.
load_inline(
    name="popkit_matmul_hip_library",
    cpp_sources=CPP_SRC,
    cuda_sources=HIP_SRC,
    is_python_module=False,
    extra_cuda_cflags=["--offload-arch=gfx942", "-std=c++20", "-O3"],
    verbose=True,
)


@torch.library.register_fake("popkit_matmul::matmul")
def _matmul_fake(a, b, TILE, WPT):
    # torch.compile traces with fake tensors: say what the output looks like, without running anything.
    return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.float16)


# The launch geometry, passed to the kernel at every call (`popkit tune` rewrites these values).
TILE = 16  # output tile per block: TILE x TILE, k in steps of TILE
WPT = 1  # outputs per thread, TILE/WPT rows apart (TILE x TILE/WPT threads)


def custom_kernel(data):
    """data: (a (float16), b (float16)); returns a new float16 tensor of shape (a.size(0), b.size(1))."""
    a, b = data
    return torch.ops.popkit_matmul.matmul(a, b, TILE, WPT)
