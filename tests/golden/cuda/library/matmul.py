#!POPCORN leaderboard matmul
#!POPCORN gpu H100
#!POPKIT tune BM=64,128
#!POPKIT tune BN=64,128
#!POPKIT tune WARPS_M=2,4
#!POPKIT tune WARPS_N=2,4
#!POPKIT tune STAGES=2,3
#!POPKIT tune-if WARPS_M * WARPS_N <= 8 and BM * BN // (WARPS_M * WARPS_N) <= 2048
#
# matmul: a simple, correct CUDA kernel, rendered by `popkit new` (style: library)
# from matmul/kernel.yml.
# The extension builds once, when this module is imported; custom_kernel(data) is the entry point.
# Check the build with `popkit compile FILE`, the output with `popkit test FILE`; `popkit tune FILE -o OUT`
# times every launch geometry the `#!POPKIT tune` lines list (all compiled into this one extension) and
# writes OUT with the fastest.

import torch
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <cuda_runtime.h>
#include <mma.h>
#include <cuda_fp16.h>
#include <torch/types.h>
#include <torch/library.h>
#include <algorithm>
#include <cmath>
#include <cstdint>

// Tensor cores through WMMA (float16 operands, float32 accumulators), the structure of
// submissions/matmul/cuda.py with its sizes as template parameters:
//   * a block of WARPS_M x WARPS_N warps computes a BM x BN tile of the output; each warp owns a
//     BM/WARPS_M x BN/WARPS_N sub-tile of 16 x 16 fragments, held in registers for the whole k loop;
//   * k is walked in slices of 32: STAGES slices of a (BM x 32) and b (32 x BN) are in
//     shared memory at once, fetched by cp.async (sm_80+) while the warps multiply the oldest;
//   * shared-memory rows are padded by 8 halves (16 bytes), so fragment loads spread over the banks;
//   * 16-byte copies when k and n are multiples of 8 and both operands are 16-byte aligned (PK_VEC),
//     element by element otherwise; loads outside the matrices are zeros and stores are guarded,
//     so any m, n, k is right;
//   * the epilogue passes each fragment through a per-warp 16 x 16 float tile in shared memory (a
//     fragment's register layout is unspecified) and runs the body per element with row, col, acc.
constexpr int PK_BK = 32;  // k slice per stage
constexpr int PK_PAD = 8;  // halves of padding per shared-memory row

// Dynamic shared memory of one block: the stages during the k loop, then (same bytes) the epilogue tiles.
template <int BM, int BN, int STAGES>
constexpr int pk_smem_bytes(int warps) {
    return STAGES * (BM * (PK_BK + PK_PAD) + PK_BK * (BN + PK_PAD)) * 2 > warps * 16 * 16 * 4
               ? STAGES * (BM * (PK_BK + PK_PAD) + PK_BK * (BN + PK_PAD)) * 2 : warps * 16 * 16 * 4;
}

// 16-byte global -> shared copy; `pk_valid` false fills the 16 bytes with zeros and reads nothing.
__device__ __forceinline__ void pk_copy16(void* pk_dst, const void* pk_src, bool pk_valid) {
#if __CUDA_ARCH__ >= 800
    const unsigned pk_addr = static_cast<unsigned>(__cvta_generic_to_shared(pk_dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(pk_addr), "l"(pk_src), "r"(pk_valid ? 16 : 0));
#else
    *reinterpret_cast<uint4*>(pk_dst) = pk_valid ? *reinterpret_cast<const uint4*>(pk_src) : make_uint4(0, 0, 0, 0);
#endif
}

__device__ __forceinline__ void pk_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Wait until at most N committed groups of copies are in flight.
template <int N>
__device__ __forceinline__ void pk_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// Copy the k slice at pk_k0 of the block's rows of a and columns of b into one stage, in chunks of
// 8 halves; consecutive threads take consecutive chunks of a row (coalesced reads).
template <int BM, int BN, int THREADS, bool PK_VEC>
__device__ __forceinline__ void pk_load_slice(__half* pk_as, __half* pk_bs, const __half* __restrict__ pk_ga,
                                              const __half* __restrict__ pk_gb, int pk_m, int pk_n, int pk_k,
                                              int pk_m0, int pk_n0, int pk_k0) {
    constexpr int PK_A_CHUNKS = BM * PK_BK / 8, PK_B_CHUNKS = PK_BK * BN / 8;
#pragma unroll
    for (int pk_i = 0; pk_i < (PK_A_CHUNKS + THREADS - 1) / THREADS; ++pk_i) {
        const int pk_q = threadIdx.x + pk_i * THREADS;
        if (PK_A_CHUNKS % THREADS == 0 || pk_q < PK_A_CHUNKS) {
            const int pk_r = pk_q / (PK_BK / 8), pk_c = pk_q % (PK_BK / 8) * 8;
            const int pk_gr = pk_m0 + pk_r, pk_gc = pk_k0 + pk_c;
            __half* pk_dst = pk_as + pk_r * (PK_BK + PK_PAD) + pk_c;
            const __half* pk_src = pk_ga + static_cast<int64_t>(pk_gr) * pk_k + pk_gc;
            if (PK_VEC) {
                const bool pk_valid = pk_gr < pk_m && pk_gc < pk_k;  // k % 8 == 0: a chunk is wholly in or out
                pk_copy16(pk_dst, pk_valid ? pk_src : pk_ga, pk_valid);
            } else {
#pragma unroll
                for (int pk_e = 0; pk_e < 8; ++pk_e)
                    pk_dst[pk_e] = pk_gr < pk_m && pk_gc + pk_e < pk_k ? pk_src[pk_e] : __float2half(0.0f);
            }
        }
    }
#pragma unroll
    for (int pk_i = 0; pk_i < (PK_B_CHUNKS + THREADS - 1) / THREADS; ++pk_i) {
        const int pk_q = threadIdx.x + pk_i * THREADS;
        if (PK_B_CHUNKS % THREADS == 0 || pk_q < PK_B_CHUNKS) {
            const int pk_r = pk_q / (BN / 8), pk_c = pk_q % (BN / 8) * 8;
            const int pk_gr = pk_k0 + pk_r, pk_gc = pk_n0 + pk_c;
            __half* pk_dst = pk_bs + pk_r * (BN + PK_PAD) + pk_c;
            const __half* pk_src = pk_gb + static_cast<int64_t>(pk_gr) * pk_n + pk_gc;
            if (PK_VEC) {
                const bool pk_valid = pk_gr < pk_k && pk_gc < pk_n;  // n % 8 == 0
                pk_copy16(pk_dst, pk_valid ? pk_src : pk_gb, pk_valid);
            } else {
#pragma unroll
                for (int pk_e = 0; pk_e < 8; ++pk_e)
                    pk_dst[pk_e] = pk_gr < pk_k && pk_gc + pk_e < pk_n ? pk_src[pk_e] : __float2half(0.0f);
            }
        }
    }
}

// The launch geometry (BM, BN, WARPS_M, WARPS_N, STAGES) is a template parameter: each grid point is its own kernel (two: PK_VEC).
template <int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, bool PK_VEC>
__global__ void __launch_bounds__(32 * WARPS_M * WARPS_N, WARPS_M * WARPS_N >= 8 ? 2 : 1)
matmul_kernel(const __half* __restrict__ a,
              const __half* __restrict__ b,
              __half* __restrict__ c,
              int64_t m,
              int64_t n,
              int64_t k) {
    using namespace nvcuda;
    constexpr int PK_THREADS = 32 * WARPS_M * WARPS_N;
    constexpr int PK_WM = BM / WARPS_M, PK_WN = BN / WARPS_N;  // a warp's sub-tile
    constexpr int PK_FM = PK_WM / 16, PK_FN = PK_WN / 16;        // its fragments
    constexpr int PK_A_STAGE = BM * (PK_BK + PK_PAD), PK_B_STAGE = PK_BK * (BN + PK_PAD);
    static_assert(PK_FM >= 1 && PK_FN >= 1 && PK_WM % 16 == 0 && PK_WN % 16 == 0, "warp tiles of 16 x 16 fragments");
    extern __shared__ __align__(128) unsigned char pk_smem[];
    __half* const pk_as = reinterpret_cast<__half*>(pk_smem);
    __half* const pk_bs = pk_as + STAGES * PK_A_STAGE;
    const int pk_warp = threadIdx.x / 32, pk_lane = threadIdx.x % 32;
    const int pk_wm = pk_warp / WARPS_N, pk_wn = pk_warp % WARPS_N;
    // In 32 bits (the launcher checks m, n and k fit): fewer registers for the copies' addresses.
    const int pk_m = static_cast<int>(m), pk_n = static_cast<int>(n), pk_k = static_cast<int>(k);
    const int pk_m0 = blockIdx.y * BM, pk_n0 = blockIdx.x * BN;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> pk_acc[PK_FM][PK_FN];
#pragma unroll
    for (int pk_i = 0; pk_i < PK_FM; ++pk_i)
#pragma unroll
        for (int pk_j = 0; pk_j < PK_FN; ++pk_j) wmma::fill_fragment(pk_acc[pk_i][pk_j], 0.0f);

    // Slices 0 .. STAGES-2 in flight first; one commit group per slice, empty past the end, so that
    // "all but STAGES-2 groups done" always means "slice ks is here".
    const int pk_slices = (pk_k + PK_BK - 1) / PK_BK;
#pragma unroll
    for (int pk_s = 0; pk_s < STAGES - 1; ++pk_s) {
        if (pk_s < pk_slices)
            pk_load_slice<BM, BN, PK_THREADS, PK_VEC>(pk_as + pk_s * PK_A_STAGE, pk_bs + pk_s * PK_B_STAGE, a, b,
                                                      pk_m, pk_n, pk_k, pk_m0, pk_n0, pk_s * PK_BK);
        pk_commit();
    }
    for (int pk_ks = 0; pk_ks < pk_slices; ++pk_ks) {
        pk_wait<STAGES - 2>();
        // Slice ks is in shared memory for every warp, and every warp is done with slice ks-1, whose stage
        // the next copy refills.
        __syncthreads();
        const int pk_next = pk_ks + STAGES - 1;
        if (pk_next < pk_slices)
            pk_load_slice<BM, BN, PK_THREADS, PK_VEC>(pk_as + pk_next % STAGES * PK_A_STAGE,
                                                      pk_bs + pk_next % STAGES * PK_B_STAGE, a, b, pk_m,
                                                      pk_n, pk_k, pk_m0, pk_n0, pk_next * PK_BK);
        pk_commit();
        const __half* pk_sa = pk_as + pk_ks % STAGES * PK_A_STAGE;
        const __half* pk_sb = pk_bs + pk_ks % STAGES * PK_B_STAGE;
#pragma unroll
        for (int pk_kk = 0; pk_kk < PK_BK; pk_kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> pk_fa[PK_FM];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> pk_fb[PK_FN];
#pragma unroll
            for (int pk_i = 0; pk_i < PK_FM; ++pk_i)
                wmma::load_matrix_sync(pk_fa[pk_i], pk_sa + (pk_wm * PK_WM + pk_i * 16) * (PK_BK + PK_PAD) + pk_kk,
                                       PK_BK + PK_PAD);
#pragma unroll
            for (int pk_j = 0; pk_j < PK_FN; ++pk_j)
                wmma::load_matrix_sync(pk_fb[pk_j], pk_sb + pk_kk * (BN + PK_PAD) + pk_wn * PK_WN + pk_j * 16, BN + PK_PAD);
#pragma unroll
            for (int pk_i = 0; pk_i < PK_FM; ++pk_i)
#pragma unroll
                for (int pk_j = 0; pk_j < PK_FN; ++pk_j)
                    wmma::mma_sync(pk_acc[pk_i][pk_j], pk_fa[pk_i], pk_fb[pk_j], pk_acc[pk_i][pk_j]);
        }
    }
    pk_wait<0>();
    __syncthreads();  // the stages' bytes become the epilogue tiles

    // Epilogue: fragment -> this warp's 16 x 16 float tile -> the body, element e * 32 + lane of the tile (a
    // half-warp per row of 16).
    float* const pk_tile = reinterpret_cast<float*>(pk_smem) + pk_warp * 16 * 16;
#pragma unroll
    for (int pk_i = 0; pk_i < PK_FM; ++pk_i) {
#pragma unroll
        for (int pk_j = 0; pk_j < PK_FN; ++pk_j) {
            wmma::store_matrix_sync(pk_tile, pk_acc[pk_i][pk_j], 16, wmma::mem_row_major);
            __syncwarp();
#pragma unroll 1  // unrolled, the 8 elements' addresses stay live beside the accumulators: spills
            for (int pk_e = 0; pk_e < 8; ++pk_e) {
                const int pk_idx = pk_e * 32 + pk_lane;
                const int64_t row = pk_m0 + pk_wm * PK_WM + pk_i * 16 + pk_idx / 16;  // 64 bits for the body
                const int64_t col = pk_n0 + pk_wn * PK_WN + pk_j * 16 + pk_idx % 16;
                if (row < m && col < n) {
                    const float acc = pk_tile[pk_idx];
                    c[row * n + col] = __float2half(acc);
                }
            }
            __syncwarp();  // the tile is read before the next fragment overwrites it
        }
    }
}

// One grid point's launch.
template <int BM, int BN, int WARPS_M, int WARPS_N, int STAGES>
cudaError_t matmul_launch(const __half* __restrict__ a,
                          const __half* __restrict__ b,
                          __half* __restrict__ c,
                          int64_t m,
                          int64_t n,
                          int64_t k) {
    constexpr int pk_bytes = pk_smem_bytes<BM, BN, STAGES>(WARPS_M * WARPS_N);
    const dim3 block(32 * WARPS_M * WARPS_N);
    const dim3 grid(static_cast<unsigned int>((n + BN - 1) / BN), static_cast<unsigned int>((m + BM - 1) / BM));
    const int64_t pk_limit = int64_t{1} << 30;  // the kernel indexes within a matrix in 32 bits
    if (m >= pk_limit || n >= pk_limit || k >= pk_limit || (m + BM - 1) / BM > 65535) return cudaErrorInvalidValue;
    const bool pk_vec = k % 8 == 0 && n % 8 == 0 && reinterpret_cast<uintptr_t>(a) % 16 == 0 &&
                        reinterpret_cast<uintptr_t>(b) % 16 == 0;
    const auto pk_kernel = pk_vec ? matmul_kernel<BM, BN, WARPS_M, WARPS_N, STAGES, true> : matmul_kernel<BM, BN, WARPS_M, WARPS_N, STAGES, false>;
    if (pk_bytes > 48 * 1024) {  // above the default limit: opt in (an H100 allows 227 KB per block)
        const cudaError_t pk_err = cudaFuncSetAttribute(pk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, pk_bytes);
        if (pk_err != cudaSuccess) return pk_err;
    }
    pk_kernel<<<grid, block, pk_bytes>>>(a, b, c, m, n, k);
    return cudaGetLastError();
}

// Every point of the `#!POPKIT tune` grid is compiled here, so the source is the same whatever values the
// Python file passes, and all the variants `popkit tune` times share this one build. false: not a grid point.
bool matmul_dispatch(int64_t BM, int64_t BN, int64_t WARPS_M, int64_t WARPS_N, int64_t STAGES, cudaError_t* err,
                     const __half* __restrict__ a,
                     const __half* __restrict__ b,
                     __half* __restrict__ c,
                     int64_t m,
                     int64_t n,
                     int64_t k) {
    if (BM == 64 && BN == 64 && WARPS_M == 2 && WARPS_N == 2 && STAGES == 2) { *err = matmul_launch<64, 64, 2, 2, 2>(a, b, c, m, n, k); return true; }
    if (BM == 64 && BN == 64 && WARPS_M == 2 && WARPS_N == 2 && STAGES == 3) { *err = matmul_launch<64, 64, 2, 2, 3>(a, b, c, m, n, k); return true; }
    if (BM == 64 && BN == 64 && WARPS_M == 2 && WARPS_N == 4 && STAGES == 2) { *err = matmul_launch<64, 64, 2, 4, 2>(a, b, c, m, n, k); return true; }
    if (BM == 64 && BN == 64 && WARPS_M == 2 && WARPS_N == 4 && STAGES == 3) { *err = matmul_launch<64, 64, 2, 4, 3>(a, b, c, m, n, k); return true; }
    if (BM == 64 && BN == 64 && WARPS_M == 4 && WARPS_N == 2 && STAGES == 2) { *err = matmul_launch<64, 64, 4, 2, 2>(a, b, c, m, n, k); return true; }
    if (BM == 64 && BN == 64 && WARPS_M == 4 && WARPS_N == 2 && STAGES == 3) { *err = matmul_launch<64, 64, 4, 2, 3>(a, b, c, m, n, k); return true; }
    if (BM == 64 && BN == 128 && WARPS_M == 2 && WARPS_N == 2 && STAGES == 2) { *err = matmul_launch<64, 128, 2, 2, 2>(a, b, c, m, n, k); return true; }
    if (BM == 64 && BN == 128 && WARPS_M == 2 && WARPS_N == 2 && STAGES == 3) { *err = matmul_launch<64, 128, 2, 2, 3>(a, b, c, m, n, k); return true; }
    if (BM == 64 && BN == 128 && WARPS_M == 2 && WARPS_N == 4 && STAGES == 2) { *err = matmul_launch<64, 128, 2, 4, 2>(a, b, c, m, n, k); return true; }
    if (BM == 64 && BN == 128 && WARPS_M == 2 && WARPS_N == 4 && STAGES == 3) { *err = matmul_launch<64, 128, 2, 4, 3>(a, b, c, m, n, k); return true; }
    if (BM == 64 && BN == 128 && WARPS_M == 4 && WARPS_N == 2 && STAGES == 2) { *err = matmul_launch<64, 128, 4, 2, 2>(a, b, c, m, n, k); return true; }
    if (BM == 64 && BN == 128 && WARPS_M == 4 && WARPS_N == 2 && STAGES == 3) { *err = matmul_launch<64, 128, 4, 2, 3>(a, b, c, m, n, k); return true; }
    if (BM == 128 && BN == 64 && WARPS_M == 2 && WARPS_N == 2 && STAGES == 2) { *err = matmul_launch<128, 64, 2, 2, 2>(a, b, c, m, n, k); return true; }
    if (BM == 128 && BN == 64 && WARPS_M == 2 && WARPS_N == 2 && STAGES == 3) { *err = matmul_launch<128, 64, 2, 2, 3>(a, b, c, m, n, k); return true; }
    if (BM == 128 && BN == 64 && WARPS_M == 2 && WARPS_N == 4 && STAGES == 2) { *err = matmul_launch<128, 64, 2, 4, 2>(a, b, c, m, n, k); return true; }
    if (BM == 128 && BN == 64 && WARPS_M == 2 && WARPS_N == 4 && STAGES == 3) { *err = matmul_launch<128, 64, 2, 4, 3>(a, b, c, m, n, k); return true; }
    if (BM == 128 && BN == 64 && WARPS_M == 4 && WARPS_N == 2 && STAGES == 2) { *err = matmul_launch<128, 64, 4, 2, 2>(a, b, c, m, n, k); return true; }
    if (BM == 128 && BN == 64 && WARPS_M == 4 && WARPS_N == 2 && STAGES == 3) { *err = matmul_launch<128, 64, 4, 2, 3>(a, b, c, m, n, k); return true; }
    if (BM == 128 && BN == 128 && WARPS_M == 2 && WARPS_N == 4 && STAGES == 2) { *err = matmul_launch<128, 128, 2, 4, 2>(a, b, c, m, n, k); return true; }
    if (BM == 128 && BN == 128 && WARPS_M == 2 && WARPS_N == 4 && STAGES == 3) { *err = matmul_launch<128, 128, 2, 4, 3>(a, b, c, m, n, k); return true; }
    if (BM == 128 && BN == 128 && WARPS_M == 4 && WARPS_N == 2 && STAGES == 2) { *err = matmul_launch<128, 128, 4, 2, 2>(a, b, c, m, n, k); return true; }
    if (BM == 128 && BN == 128 && WARPS_M == 4 && WARPS_N == 2 && STAGES == 3) { *err = matmul_launch<128, 128, 4, 2, 3>(a, b, c, m, n, k); return true; }
    return false;
}

torch::Tensor matmul(torch::Tensor a, torch::Tensor b, int64_t BM, int64_t BN, int64_t WARPS_M, int64_t WARPS_N, int64_t STAGES) {
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
        cudaError_t err = cudaSuccess;
        const bool found = matmul_dispatch(BM, BN, WARPS_M, WARPS_N, STAGES, &err,
                                           static_cast<const __half*>(a.data_ptr()),
                                           static_cast<const __half*>(b.data_ptr()),
                                           static_cast<__half*>(c.data_ptr()),
                                           m,
                                           n,
                                           k);
        TORCH_CHECK(found, "matmul: no kernel compiled for BM=", BM, ", BN=", BN, ", WARPS_M=", WARPS_M, ", WARPS_N=", WARPS_N, ", STAGES=", STAGES, ": the `#!POPKIT tune` lines list the values compiled");
        TORCH_CHECK(err == cudaSuccess, "matmul_kernel failed to launch: ", cudaGetErrorString(err));
    }
    return c;
}

TORCH_LIBRARY_IMPL(popkit_matmul, CUDA, m) {
    m.impl("matmul", &matmul);
}
"""

CPP_SRC = r"""
#include <torch/library.h>

TORCH_LIBRARY(popkit_matmul, m) {
    m.def("matmul(Tensor a, Tensor b, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES) -> Tensor");
}
"""

# The source registers the operator popkit_matmul::matmul: its schema in TORCH_LIBRARY (C++ source),
# its GPU implementation in TORCH_LIBRARY_IMPL (kernel source). is_python_module=False loads the
# built library into this process, which runs both registrations.
load_inline(
    name="popkit_matmul_cuda_library",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    is_python_module=False,
    extra_cuda_cflags=["-O3"],
    verbose=True,
)


@torch.library.register_fake("popkit_matmul::matmul")
def _matmul_fake(a, b, BM, BN, WARPS_M, WARPS_N, STAGES):
    # torch.compile traces with fake tensors: say what the output looks like, without running anything.
    return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.float16)


# The launch geometry, passed to the kernel at every call (`popkit tune` rewrites these values).
BM = 128  # output rows per block
BN = 128  # output columns per block
WARPS_M = 2  # warps along m: each owns BM/WARPS_M rows
WARPS_N = 4  # warps along n: each owns BN/WARPS_N columns
STAGES = 2  # k slices of 32 in shared memory (cp.async pipeline depth)


def custom_kernel(data):
    """data: (a (float16), b (float16)); returns a new float16 tensor of shape (a.size(0), b.size(1))."""
    a, b = data
    return torch.ops.popkit_matmul.matmul(a, b, BM, BN, WARPS_M, WARPS_N, STAGES)
