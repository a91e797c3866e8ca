// popkit's HIP-to-CUDA mapping: HIP kernels built with nvcc and run on an NVIDIA GPU, as a check of
// their logic (`popkit test --hip-on-cuda`). It maps the part of the HIP API that popkit's templates
// and examples use; it is not HIP. CUDA warps have 32 lanes where AMD wavefronts have 64: the
// maskless warp functions below act on a 32-lane warp, and __ballot returns the 32 lanes' bits in a
// 64-bit value, as HIP's does for 64 lanes.
#pragma once

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define POPKIT_HIP_ON_CUDA 1

// Runtime: errors, launches, synchronisation.
typedef cudaError_t hipError_t;
typedef cudaStream_t hipStream_t;
static constexpr cudaError_t hipSuccess = cudaSuccess;
inline hipError_t hipGetLastError() { return cudaGetLastError(); }
inline hipError_t hipPeekAtLastError() { return cudaPeekAtLastError(); }
inline const char* hipGetErrorString(hipError_t err) { return cudaGetErrorString(err); }
inline hipError_t hipDeviceSynchronize() { return cudaDeviceSynchronize(); }
#define hipLaunchKernelGGL(kernel, grid, block, shared_bytes, stream, ...) \
    kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__)

// Types.
typedef __nv_bfloat16 __hip_bfloat16;
typedef __nv_bfloat162 __hip_bfloat162;

// HIP's warp functions take no mask; CUDA's *_sync forms over the whole 32-lane warp.
namespace popkit_hip {
template <typename T> __device__ __forceinline__ T shfl(T v, int lane, int width = warpSize) {
    return __shfl_sync(0xffffffffu, v, lane, width);
}
template <typename T> __device__ __forceinline__ T shfl_up(T v, unsigned int delta, int width = warpSize) {
    return __shfl_up_sync(0xffffffffu, v, delta, width);
}
template <typename T> __device__ __forceinline__ T shfl_down(T v, unsigned int delta, int width = warpSize) {
    return __shfl_down_sync(0xffffffffu, v, delta, width);
}
template <typename T> __device__ __forceinline__ T shfl_xor(T v, int mask, int width = warpSize) {
    return __shfl_xor_sync(0xffffffffu, v, mask, width);
}
__device__ __forceinline__ unsigned long long ballot(int predicate) {
    return static_cast<unsigned long long>(__ballot_sync(0xffffffffu, predicate));
}
__device__ __forceinline__ int any(int predicate) { return __any_sync(0xffffffffu, predicate); }
__device__ __forceinline__ int all(int predicate) { return __all_sync(0xffffffffu, predicate); }
}  // namespace popkit_hip

#define __shfl(...) popkit_hip::shfl(__VA_ARGS__)
#define __shfl_up(...) popkit_hip::shfl_up(__VA_ARGS__)
#define __shfl_down(...) popkit_hip::shfl_down(__VA_ARGS__)
#define __shfl_xor(...) popkit_hip::shfl_xor(__VA_ARGS__)
#define __ballot(p) popkit_hip::ballot(p)
#define __any(p) popkit_hip::any(p)
#define __all(p) popkit_hip::all(p)
