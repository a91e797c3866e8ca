#!POPCORN leaderboard grayscale
#!POPCORN gpu MI300
#!POPKIT tune BLOCK=64,128,256,512,1024
#!POPKIT tune ROWS=1,2,4
#
# grayscale: a simple, correct HIP kernel, rendered by `popkit new` (style: library)
# from grayscale/kernel.yml.
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
#include <algorithm>
#include <cmath>
#include <cstdint>

// The launch geometry (BLOCK, ROWS) is a template parameter: each grid point is its own kernel.
template <int BLOCK, int ROWS>
__global__ void __launch_bounds__(BLOCK) grayscale_kernel(const float* __restrict__ rgb,
                                                          float* __restrict__ gray,
                                                          int64_t rows,
                                                          int64_t cols) {
    // Blocks of 32 columns by BLOCK/32 rows of threads; a thread takes ROWS rows, BLOCK/32 apart, per step of
    // the loop over rows (which goes past 65535 blocks); idx = row * cols + col.
    const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
    if (col >= cols) return;
    const int64_t stride = static_cast<int64_t>(gridDim.y) * (BLOCK / 32) * ROWS;
    for (int64_t base = static_cast<int64_t>(blockIdx.y) * (BLOCK / 32) * ROWS + threadIdx.y; base < rows;
         base += stride) {
#pragma unroll
        for (int v = 0; v < ROWS; ++v) {
            const int64_t row = base + static_cast<int64_t>(v) * (BLOCK / 32);
            if (row < rows) {
                const int64_t idx = row * cols + col;
                const float* px = rgb + idx * 3;
                gray[idx] = 0.2989f * px[0] + 0.5870f * px[1] + 0.1140f * px[2];
            }
        }
    }
}

// One grid point's launch.
template <int BLOCK, int ROWS>
hipError_t grayscale_launch(const float* __restrict__ rgb,
                            float* __restrict__ gray,
                            int64_t rows,
                            int64_t cols) {
    const dim3 block(32, BLOCK / 32);
    const int64_t blocks_y = std::min<int64_t>((rows + BLOCK / 32 * ROWS - 1) / (BLOCK / 32 * ROWS), 65535);
    const dim3 grid(static_cast<unsigned int>((cols + 31) / 32), static_cast<unsigned int>(blocks_y));
    grayscale_kernel<BLOCK, ROWS><<<grid, block>>>(rgb, gray, rows, cols);
    return hipGetLastError();
}

// Every point of the `#!POPKIT tune` grid is compiled here, so the source is the same whatever values the
// Python file passes, and all the variants `popkit tune` times share this one build. false: not a grid point.
bool grayscale_dispatch(int64_t BLOCK, int64_t ROWS, hipError_t* err,
                        const float* __restrict__ rgb,
                        float* __restrict__ gray,
                        int64_t rows,
                        int64_t cols) {
    if (BLOCK == 64 && ROWS == 1) { *err = grayscale_launch<64, 1>(rgb, gray, rows, cols); return true; }
    if (BLOCK == 64 && ROWS == 2) { *err = grayscale_launch<64, 2>(rgb, gray, rows, cols); return true; }
    if (BLOCK == 64 && ROWS == 4) { *err = grayscale_launch<64, 4>(rgb, gray, rows, cols); return true; }
    if (BLOCK == 128 && ROWS == 1) { *err = grayscale_launch<128, 1>(rgb, gray, rows, cols); return true; }
    if (BLOCK == 128 && ROWS == 2) { *err = grayscale_launch<128, 2>(rgb, gray, rows, cols); return true; }
    if (BLOCK == 128 && ROWS == 4) { *err = grayscale_launch<128, 4>(rgb, gray, rows, cols); return true; }
    if (BLOCK == 256 && ROWS == 1) { *err = grayscale_launch<256, 1>(rgb, gray, rows, cols); return true; }
    if (BLOCK == 256 && ROWS == 2) { *err = grayscale_launch<256, 2>(rgb, gray, rows, cols); return true; }
    if (BLOCK == 256 && ROWS == 4) { *err = grayscale_launch<256, 4>(rgb, gray, rows, cols); return true; }
    if (BLOCK == 512 && ROWS == 1) { *err = grayscale_launch<512, 1>(rgb, gray, rows, cols); return true; }
    if (BLOCK == 512 && ROWS == 2) { *err = grayscale_launch<512, 2>(rgb, gray, rows, cols); return true; }
    if (BLOCK == 512 && ROWS == 4) { *err = grayscale_launch<512, 4>(rgb, gray, rows, cols); return true; }
    if (BLOCK == 1024 && ROWS == 1) { *err = grayscale_launch<1024, 1>(rgb, gray, rows, cols); return true; }
    if (BLOCK == 1024 && ROWS == 2) { *err = grayscale_launch<1024, 2>(rgb, gray, rows, cols); return true; }
    if (BLOCK == 1024 && ROWS == 4) { *err = grayscale_launch<1024, 4>(rgb, gray, rows, cols); return true; }
    return false;
}
"""

# The torch wrapper that checks the tensors and launches the kernels above.
HOST_SRC = r"""
#include <torch/types.h>
#include <torch/library.h>

torch::Tensor grayscale(torch::Tensor rgb, int64_t BLOCK, int64_t ROWS) {
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
        hipError_t err = hipSuccess;
        const bool found = grayscale_dispatch(BLOCK, ROWS, &err,
                                              static_cast<const float*>(rgb.data_ptr()),
                                              static_cast<float*>(gray.data_ptr()),
                                              rows,
                                              cols);
        TORCH_CHECK(found, "grayscale: no kernel compiled for BLOCK=", BLOCK, ", ROWS=", ROWS, ": the `#!POPKIT tune` lines list the values compiled");
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
    m.def("grayscale(Tensor rgb, int BLOCK, int ROWS) -> Tensor");
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
def _grayscale_fake(rgb, BLOCK, ROWS):
    # torch.compile traces with fake tensors: say what the output looks like, without running anything.
    return rgb.new_empty(_without_dims(rgb.shape, (-1,)), dtype=torch.float32)


# The launch geometry, passed to the kernel at every call (`popkit tune` rewrites these values).
BLOCK = 256  # threads per block: 32 columns by BLOCK/32 rows
ROWS = 1  # rows per thread per step, BLOCK/32 apart


def custom_kernel(data):
    """data: rgb (float32); returns a new float32 tensor: rgb without dims [-1]."""
    rgb = data
    return torch.ops.popkit_grayscale.grayscale(rgb, BLOCK, ROWS)
