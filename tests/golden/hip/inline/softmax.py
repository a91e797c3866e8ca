#!POPCORN leaderboard softmax
#!POPCORN gpu MI300
#!POPKIT tune BLOCK=64,128,256,512,1024
#!POPKIT tune ROWS=1,2,4,8
#
# softmax: a simple, correct HIP kernel, rendered by `popkit new` (style: inline)
# from softmax/kernel.yml.
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

// Tree reduction in shared memory over a block whose size is a power of two. It does not depend
// on the warp width, so the same code is right for 32-lane warps and 64-lane wavefronts. Every
// thread gets the result.
struct SumOp { __device__ float operator()(float a, float b) const { return a + b; } };
struct MaxOp { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };
struct MinOp { __device__ float operator()(float a, float b) const { return fminf(a, b); } };

template <typename Op>
__device__ float block_reduce(float value, float* smem, Op op) {
    smem[threadIdx.x] = value;
    __syncthreads();
    for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) smem[threadIdx.x] = op(smem[threadIdx.x], smem[threadIdx.x + s]);
        __syncthreads();
    }
    const float result = smem[0];
    __syncthreads();  // smem is reused by the next reduction
    return result;
}

// The launch geometry (BLOCK, ROWS) is a template parameter: each grid point is its own kernel.
template <int BLOCK, int ROWS>
__global__ void __launch_bounds__(BLOCK) softmax_kernel(const float* __restrict__ x,
                                                        float* __restrict__ y,
                                                        int64_t rows,
                                                        int64_t cols) {
    // ROWS rows per block, one after another, each by the whole block: x, y point at the
    // current row of `cols` elements.
    __shared__ float smem[BLOCK];
    const int64_t first = static_cast<int64_t>(blockIdx.x) * ROWS;
    x += first * cols;
    y += first * cols;
    for (int64_t row = first; row < rows && row < first + ROWS; ++row, x += cols, y += cols) {
        float row_max = -INFINITY;
        for (int64_t j = threadIdx.x; j < cols; j += BLOCK) {
            row_max = fmaxf(row_max, x[j]);
        }
        row_max = block_reduce(row_max, smem, MaxOp());

        float row_sum = 0.0f;
        for (int64_t j = threadIdx.x; j < cols; j += BLOCK) {
            row_sum += expf(x[j] - row_max);
        }
        row_sum = block_reduce(row_sum, smem, SumOp());

        for (int64_t j = threadIdx.x; j < cols; j += BLOCK) {
            y[j] = expf(x[j] - row_max) / row_sum;
        }
    }
}

// One grid point's launch.
template <int BLOCK, int ROWS>
hipError_t softmax_launch(const float* __restrict__ x,
                          float* __restrict__ y,
                          int64_t rows,
                          int64_t cols) {
    const dim3 block(BLOCK);
    const dim3 grid(static_cast<unsigned int>((rows + ROWS - 1) / ROWS));
    softmax_kernel<BLOCK, ROWS><<<grid, block>>>(x, y, rows, cols);
    return hipGetLastError();
}

// Every point of the `#!POPKIT tune` grid is compiled here, so the source is the same whatever values the
// Python file passes, and all the variants `popkit tune` times share this one build. false: not a grid point.
bool softmax_dispatch(int64_t BLOCK, int64_t ROWS, hipError_t* err,
                      const float* __restrict__ x,
                      float* __restrict__ y,
                      int64_t rows,
                      int64_t cols) {
    if (BLOCK == 64 && ROWS == 1) { *err = softmax_launch<64, 1>(x, y, rows, cols); return true; }
    if (BLOCK == 64 && ROWS == 2) { *err = softmax_launch<64, 2>(x, y, rows, cols); return true; }
    if (BLOCK == 64 && ROWS == 4) { *err = softmax_launch<64, 4>(x, y, rows, cols); return true; }
    if (BLOCK == 64 && ROWS == 8) { *err = softmax_launch<64, 8>(x, y, rows, cols); return true; }
    if (BLOCK == 128 && ROWS == 1) { *err = softmax_launch<128, 1>(x, y, rows, cols); return true; }
    if (BLOCK == 128 && ROWS == 2) { *err = softmax_launch<128, 2>(x, y, rows, cols); return true; }
    if (BLOCK == 128 && ROWS == 4) { *err = softmax_launch<128, 4>(x, y, rows, cols); return true; }
    if (BLOCK == 128 && ROWS == 8) { *err = softmax_launch<128, 8>(x, y, rows, cols); return true; }
    if (BLOCK == 256 && ROWS == 1) { *err = softmax_launch<256, 1>(x, y, rows, cols); return true; }
    if (BLOCK == 256 && ROWS == 2) { *err = softmax_launch<256, 2>(x, y, rows, cols); return true; }
    if (BLOCK == 256 && ROWS == 4) { *err = softmax_launch<256, 4>(x, y, rows, cols); return true; }
    if (BLOCK == 256 && ROWS == 8) { *err = softmax_launch<256, 8>(x, y, rows, cols); return true; }
    if (BLOCK == 512 && ROWS == 1) { *err = softmax_launch<512, 1>(x, y, rows, cols); return true; }
    if (BLOCK == 512 && ROWS == 2) { *err = softmax_launch<512, 2>(x, y, rows, cols); return true; }
    if (BLOCK == 512 && ROWS == 4) { *err = softmax_launch<512, 4>(x, y, rows, cols); return true; }
    if (BLOCK == 512 && ROWS == 8) { *err = softmax_launch<512, 8>(x, y, rows, cols); return true; }
    if (BLOCK == 1024 && ROWS == 1) { *err = softmax_launch<1024, 1>(x, y, rows, cols); return true; }
    if (BLOCK == 1024 && ROWS == 2) { *err = softmax_launch<1024, 2>(x, y, rows, cols); return true; }
    if (BLOCK == 1024 && ROWS == 4) { *err = softmax_launch<1024, 4>(x, y, rows, cols); return true; }
    if (BLOCK == 1024 && ROWS == 8) { *err = softmax_launch<1024, 8>(x, y, rows, cols); return true; }
    return false;
}
"""

# The torch wrapper that checks the tensors and launches the kernels above.
HOST_SRC = r"""
#include <torch/types.h>

torch::Tensor softmax(torch::Tensor x, int64_t BLOCK, int64_t ROWS) {
    TORCH_CHECK(x.is_cuda(), "softmax: `x` must be a GPU tensor");
    TORCH_CHECK(x.scalar_type() == at::kFloat, "softmax: `x` must be float32, got ", x.scalar_type());
    x = x.contiguous();
    TORCH_CHECK(x.dim() >= 1, "softmax: `x` must have at least 1 dimension");
    const int64_t cols = x.size(-1);
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    torch::Tensor y = torch::empty_like(x);
    if (rows > 0) {
        hipError_t err = hipSuccess;
        const bool found = softmax_dispatch(BLOCK, ROWS, &err,
                                            static_cast<const float*>(x.data_ptr()),
                                            static_cast<float*>(y.data_ptr()),
                                            rows,
                                            cols);
        TORCH_CHECK(found, "softmax: no kernel compiled for BLOCK=", BLOCK, ", ROWS=", ROWS, ": the `#!POPKIT tune` lines list the values compiled");
        TORCH_CHECK(err == hipSuccess, "softmax_kernel failed to launch: ", hipGetErrorString(err));
    }
    return y;
}
"""

# The leaderboard gets this one file, and load_inline one source: the kernels, then the wrapper.
HIP_SRC = DEVICE_SRC + HOST_SRC

CPP_SRC = r"""
torch::Tensor softmax(torch::Tensor x, int64_t BLOCK, int64_t ROWS);
"""

# Built once, at import: the leaderboard's compile step warms the cache for every later process.
_module = load_inline(
    name="popkit_softmax_hip_inline",
    cpp_sources=CPP_SRC,
    cuda_sources=HIP_SRC,
    functions=["softmax"],
    extra_cuda_cflags=["--offload-arch=gfx942", "-std=c++20", "-O3"],
    verbose=True,
)


# The launch geometry, passed to the kernel at every call (`popkit tune` rewrites these values).
BLOCK = 256  # threads per block, all on one row at a time
ROWS = 1  # rows per block, one after another


def custom_kernel(data):
    """data: x (float32); returns a new float32 tensor shaped like x."""
    x = data
    return _module.softmax(x, BLOCK, ROWS)
