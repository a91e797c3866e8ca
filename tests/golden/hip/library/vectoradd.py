#!POPCORN leaderboard vectoradd
#!POPCORN gpu MI300
#
# vectoradd: a simple, correct HIP kernel, rendered by `popkit new` (style: library)
# from vectoradd/kernel.yml.
# The extension builds once, when this module is imported; custom_kernel(data) is the entry point.
# Check the build with `popkit compile FILE`, the output with `popkit test FILE`.

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
"""

# The torch wrapper that checks the tensors and launches the kernels above.
HOST_SRC = r"""
#include <torch/types.h>
#include <torch/library.h>

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
        const hipError_t err = hipGetLastError();
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
    m.def("vectoradd(Tensor a, Tensor b) -> Tensor");
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
def _vectoradd_fake(a, b):
    # torch.compile traces with fake tensors: say what the output looks like, without running anything.
    return torch.empty_like(a)


def custom_kernel(data):
    """data: (a (float16), b (float16)); returns a new float16 tensor shaped like a."""
    a, b = data
    return torch.ops.popkit_vectoradd.vectoradd(a, b)
