#!POPCORN leaderboard vectoradd
#!POPCORN gpu MI300
#!POPKIT tune BLOCK=64,128,256,512,1024
#!POPKIT tune VEC=1,2,4,8
#
# vectoradd: a simple, correct HIP kernel, rendered by `popkit new` (style: library)
# from vectoradd/kernel.yml.
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
hipError_t vectoradd_launch(const __half* __restrict__ a,
                            const __half* __restrict__ b,
                            __half* __restrict__ out,
                            int64_t n) {
    const dim3 block(BLOCK);
    const dim3 grid(static_cast<unsigned int>(std::min<int64_t>((n + BLOCK * VEC - 1) / (BLOCK * VEC), 65536)));
    vectoradd_kernel<BLOCK, VEC><<<grid, block>>>(a, b, out, n);
    return hipGetLastError();
}

// Every point of the `#!POPKIT tune` grid is compiled here, so the source is the same whatever values the
// Python file passes, and all the variants `popkit tune` times share this one build. false: not a grid point.
bool vectoradd_dispatch(int64_t BLOCK, int64_t VEC, hipError_t* err,
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
"""

# The torch wrapper that checks the tensors and launches the kernels above.
HOST_SRC = r"""
#include <torch/types.h>
#include <torch/library.h>

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
        hipError_t err = hipSuccess;
        const bool found = vectoradd_dispatch(BLOCK, VEC, &err,
                                              static_cast<const __half*>(a.data_ptr()),
                                              static_cast<const __half*>(b.data_ptr()),
                                              static_cast<__half*>(out.data_ptr()),
                                              n);
        TORCH_CHECK(found, "vectoradd: no kernel compiled for BLOCK=", BLOCK, ", VEC=", VEC, ": the `#!POPKIT tune` lines list the values compiled");
        TORCH_CHECK(err == hipSuccess, "vectoradd_kernel failed to launch: ", hipGetErrorString(err));
    }
    return out;
}

// ROCm builds of torch dispatch AMD GPUs under the CUDA key.
TORCH_LIBRARY_IMPL(popkit_vectoradd, CUDA, m) {
    m.impl("vectoradd", &vectoradd);
}
"""

# The leaderboard gets this one file, and load_inline one source: the kernels, then the wrapper.
HIP_SRC = DEVICE_SRC + HOST_SRC

CPP_SRC = r"""
#include <torch/library.h>

TORCH_LIBRARY(popkit_vectoradd, m) {
    m.def("vectoradd(Tensor a, Tensor b, int BLOCK, int VEC) -> Tensor");
}
"""

# The source registers the operator popkit_vectoradd::vectoradd: its schema in TORCH_LIBRARY (C++ source),
# its GPU implementation in TORCH_LIBRARY_IMPL (kernel source). is_python_module=False loads the
# built library into this process, which runs both registrations.
load_inline(
    name="popkit_vectoradd_hip_library",
    cpp_sources=CPP_SRC,
    cuda_sources=HIP_SRC,
    is_python_module=False,
    extra_cuda_cflags=["--offload-arch=gfx942", "-std=c++20", "-O3"],
    verbose=True,
)


@torch.library.register_fake("popkit_vectoradd::vectoradd")
def _vectoradd_fake(a, b, BLOCK, VEC):
    # torch.compile traces with fake tensors: say what the output looks like, without running anything.
    return torch.empty_like(a)


# The launch geometry, passed to the kernel at every call (`popkit tune` rewrites these values).
BLOCK = 256  # threads per block
VEC = 1  # elements per thread per step, BLOCK apart (loads stay coalesced)


def custom_kernel(data):
    """data: (a (float16), b (float16)); returns a new float16 tensor shaped like a."""
    a, b = data
    return torch.ops.popkit_vectoradd.vectoradd(a, b, BLOCK, VEC)
