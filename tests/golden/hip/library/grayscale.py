#!POPCORN leaderboard grayscale
#!POPCORN gpu MI300
#
# grayscale: a simple, correct HIP kernel, rendered by `popkit new` (style: library)
# from grayscale/kernel.yml.
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
#include <cmath>
#include <cstdint>

__global__ void grayscale_kernel(const float* __restrict__ rgb,
                                 float* __restrict__ gray,
                                 int64_t rows,
                                 int64_t cols) {
    // One thread per (row, col), idx = row * cols + col; the loop over rows goes past 65535 blocks.
    const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    for (int64_t row = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; row < rows;
         row += static_cast<int64_t>(gridDim.y) * blockDim.y) {
        const int64_t idx = row * cols + col;
        const float* px = rgb + idx * 3;
        gray[idx] = 0.2989f * px[0] + 0.5870f * px[1] + 0.1140f * px[2];
    }
}
"""

# The torch wrapper that checks the tensors and launches the kernels above.
HOST_SRC = r"""
#include <torch/types.h>
#include <torch/library.h>

torch::Tensor grayscale(torch::Tensor rgb) {
    TORCH_CHECK(rgb.is_cuda(), "grayscale: `rgb` must be a GPU tensor");
    TORCH_CHECK(rgb.scalar_type() == at::kFloat, "grayscale: `rgb` must be float32, got ", rgb.scalar_type());
    rgb = rgb.contiguous();
    TORCH_CHECK(rgb.dim() >= 2, "grayscale: `rgb` must have at least 2 dimensions");
    const int64_t rows = rgb.size(0);
    const int64_t cols = rgb.size(1);
    std::vector<int64_t> gray_sizes;
    for (int64_t d = 0; d < rgb.dim(); ++d) {
        if (d != rgb.dim() - 1) gray_sizes.push_back(rgb.size(d));
    }
    torch::Tensor gray = torch::empty(gray_sizes, rgb.options().dtype(at::kFloat));
    if (rows > 0 && cols > 0) {
        const dim3 block(32, 8);
        const int64_t blocks_y = std::min<int64_t>((rows + 7) / 8, 65535);
        const dim3 grid(static_cast<unsigned int>((cols + 31) / 32), static_cast<unsigned int>(blocks_y));
        grayscale_kernel<<<grid, block>>>(static_cast<const float*>(rgb.data_ptr()),
                                          static_cast<float*>(gray.data_ptr()),
                                          rows,
                                          cols);
        const hipError_t err = hipGetLastError();
        TORCH_CHECK(err == hipSuccess, "grayscale_kernel failed to launch: ", hipGetErrorString(err));
    }
    return gray;
}

// ROCm builds of torch dispatch AMD GPUs under the CUDA key.
TORCH_LIBRARY_IMPL(popkit_grayscale, CUDA, m) {
    m.impl("grayscale", &grayscale);
}
"""

# The leaderboard gets this one file, and load_inline one source: the kernels, then the wrapper.
HIP_SRC = DEVICE_SRC + HOST_SRC

CPP_SRC = r"""
#include <torch/library.h>

TORCH_LIBRARY(popkit_grayscale, m) {
    m.def("grayscale(Tensor rgb) -> Tensor");
}
"""

# The source registers the operator popkit_grayscale::grayscale: its schema in TORCH_LIBRARY (C++ source),
# its GPU implementation in TORCH_LIBRARY_IMPL (kernel source). is_python_module=False loads the
# built library into this process, which runs both registrations.
load_inline(
    name="popkit_grayscale_hip_library",
    cpp_sources=CPP_SRC,
    cuda_sources=HIP_SRC,
    is_python_module=False,
    extra_cuda_cflags=["--offload-arch=gfx942", "-std=c++20", "-O3"],
    verbose=True,
)


def _without_dims(shape, dims):
    """`shape` without the dimensions in `dims` (negative ones count from the end)."""
    drop = {d % len(shape) for d in dims}
    return [size for d, size in enumerate(shape) if d not in drop]


@torch.library.register_fake("popkit_grayscale::grayscale")
def _grayscale_fake(rgb):
    # torch.compile traces with fake tensors: say what the output looks like, without running anything.
    return rgb.new_empty(_without_dims(rgb.shape, (-1,)), dtype=torch.float32)


def custom_kernel(data):
    """data: rgb (float32); returns a new float32 tensor: rgb without dims [-1]."""
    rgb = data
    return torch.ops.popkit_grayscale.grayscale(rgb)
