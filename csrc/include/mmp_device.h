// Portability layer: one kernel source compiles with nvcc (CUDA) and mcc (MUSA).
//
// Kernel translation units include only this header (plus the vendor runtime it pulls in), so
// they can be compiled and checked without PyTorch. MUSA mirrors the CUDA runtime API with a
// `musa` prefix; the names below hide that difference. Selected by the compiler (__MUSACC__)
// or by the build (-DUSE_MUSA, which the MUSA build passes to both the C++ and the mcc steps).
#pragma once

#include <stdint.h>

#if defined(__MUSACC__) || defined(USE_MUSA)
#define MMP_MUSA 1
#include <musa_runtime.h>
#include <musa_fp16.h>
#include <musa_bf16.h>
typedef musaStream_t mmpStream_t;
typedef musaError_t mmpError_t;
typedef __mt_bfloat16 mmp_bf16;
#define mmpSuccess musaSuccess
#define mmpErrorInvalidValue musaErrorInvalidValue
#define mmpGetLastError musaGetLastError
#define mmpGetErrorString musaGetErrorString
#define mmpGetDevice musaGetDevice
#define mmpDeviceGetAttribute musaDeviceGetAttribute
#define mmpDevAttrMultiProcessorCount musaDevAttrMultiProcessorCount
#else
#define MMP_CUDA 1
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
typedef cudaStream_t mmpStream_t;
typedef cudaError_t mmpError_t;
typedef __nv_bfloat16 mmp_bf16;
#define mmpSuccess cudaSuccess
#define mmpErrorInvalidValue cudaErrorInvalidValue
#define mmpGetLastError cudaGetLastError
#define mmpGetErrorString cudaGetErrorString
#define mmpGetDevice cudaGetDevice
#define mmpDeviceGetAttribute cudaDeviceGetAttribute
#define mmpDevAttrMultiProcessorCount cudaDevAttrMultiProcessorCount
#endif

typedef __half mmp_fp16;

// Element types the launchers accept; the torch binding maps at::ScalarType onto these so the
// kernel units never see ATen types (at::BFloat16 / at::Half share the storage layout).
enum MmpDtype : int { MMP_F32 = 0, MMP_F16 = 1, MMP_BF16 = 2 };

#if defined(__CUDACC__) || defined(__MUSACC__)

#define MMP_DEVICE __device__ __forceinline__

// ---- conversions: all math is done in fp32 -------------------------------------------------
template <typename T>
MMP_DEVICE float mmp_to_float(T v);
template <>
MMP_DEVICE float mmp_to_float<float>(float v) { return v; }
template <>
MMP_DEVICE float mmp_to_float<mmp_fp16>(mmp_fp16 v) { return __half2float(v); }
template <>
MMP_DEVICE float mmp_to_float<mmp_bf16>(mmp_bf16 v) { return __bfloat162float(v); }

template <typename T>
MMP_DEVICE T mmp_from_float(float v);
template <>
MMP_DEVICE float mmp_from_float<float>(float v) { return v; }
template <>
MMP_DEVICE mmp_fp16 mmp_from_float<mmp_fp16>(float v) { return __float2half_rn(v); }
template <>
MMP_DEVICE mmp_bf16 mmp_from_float<mmp_bf16>(float v) { return __float2bfloat16_rn(v); }

// ---- vectorised access: VEC consecutive elements in one aligned load/store -------------------
// 16 bytes of T: the vector width used when shapes and pointers allow
template <typename T>
struct MmpMaxVec {
  static constexpr int value = 16 / (int)sizeof(T);
};

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) MmpVec {
  T v[VEC];
};

template <typename T, int VEC>
MMP_DEVICE void mmp_load(const T* base, int64_t vec_index, float (&out)[VEC]) {
  const MmpVec<T, VEC> pack = reinterpret_cast<const MmpVec<T, VEC>*>(base)[vec_index];
#pragma unroll
  for (int k = 0; k < VEC; ++k) out[k] = mmp_to_float<T>(pack.v[k]);
}

template <typename T, int VEC>
MMP_DEVICE void mmp_store(T* base, int64_t vec_index, const float (&in)[VEC]) {
  MmpVec<T, VEC> pack;
#pragma unroll
  for (int k = 0; k < VEC; ++k) pack.v[k] = mmp_from_float<T>(in[k]);
  reinterpret_cast<MmpVec<T, VEC>*>(base)[vec_index] = pack;
}

// ---- block reductions ------------------------------------------------------------------------
// Sums NV values over the whole (1-D, power-of-two sized) block; every thread gets the totals.
// CUDA: warp shuffles, then one warp over the per-warp partials. MUSA's warp width differs by
// architecture, so there a shared-memory tree is used (correct for any warp width).
#define MMP_MAX_THREADS 1024

#if defined(MMP_CUDA)
#define MMP_REDUCE_SMEM_PER_VALUE 32
template <int NV>
MMP_DEVICE void mmp_block_sum(float (&v)[NV], float* smem) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int k = 0; k < NV; ++k)
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v[k] += __shfl_xor_sync(0xffffffffu, v[k], offset);
  __syncthreads();  // smem may still be read by the previous reduction
  if (lane == 0)
#pragma unroll
    for (int k = 0; k < NV; ++k) smem[k * 32 + warp] = v[k];
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      float s = lane < num_warps ? smem[k * 32 + lane] : 0.f;
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) s += __shfl_xor_sync(0xffffffffu, s, offset);
      v[k] = s;
    }
    __syncwarp();
    if (lane == 0)
#pragma unroll
      for (int k = 0; k < NV; ++k) smem[k * 32] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < NV; ++k) v[k] = smem[k * 32];
}
#else
#define MMP_REDUCE_SMEM_PER_VALUE MMP_MAX_THREADS
template <int NV>
MMP_DEVICE void mmp_block_sum(float (&v)[NV], float* smem) {
  const int n = blockDim.x;
  __syncthreads();
#pragma unroll
  for (int k = 0; k < NV; ++k) smem[k * MMP_MAX_THREADS + threadIdx.x] = v[k];
  __syncthreads();
  for (int stride = n >> 1; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride)
#pragma unroll
      for (int k = 0; k < NV; ++k)
        smem[k * MMP_MAX_THREADS + threadIdx.x] += smem[k * MMP_MAX_THREADS + threadIdx.x + stride];
    __syncthreads();
  }
#pragma unroll
  for (int k = 0; k < NV; ++k) v[k] = smem[k * MMP_MAX_THREADS];
}
#endif

#endif  // __CUDACC__ || __MUSACC__

// ---- host helpers ----------------------------------------------------------------------------
static inline int64_t mmp_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static inline int mmp_pow2_at_least(int64_t n, int lo, int hi) {
  int p = lo;
  while (p < n && p < hi) p <<= 1;
  return p;
}

static inline int mmp_elem_size(MmpDtype t) { return t == MMP_F32 ? 4 : 2; }

// Vector width (elements): max_vec (16 bytes of T) when it divides `cols` and every listed
// pointer is aligned to its own vector size, else 1. Only these two widths are instantiated,
// which keeps the number of kernel variants (and compile time) down.
static inline int mmp_pick_vec(int64_t cols, int max_vec, const void* const* ptrs, const int* elem_sizes,
                               int n_ptrs) {
  if (max_vec <= 1 || cols % max_vec != 0) return 1;
  for (int i = 0; i < n_ptrs; ++i)
    if (ptrs[i] != nullptr && reinterpret_cast<uintptr_t>(ptrs[i]) % (uintptr_t)(max_vec * elem_sizes[i]) != 0)
      return 1;
  return max_vec;
}

// Number of multiprocessors of the current device (cached per device id).
static inline int mmp_num_sms() {
  static int cached[64] = {0};
  int dev = 0;
  if (mmpGetDevice(&dev) != mmpSuccess || dev < 0 || dev >= 64) return 80;
  if (cached[dev] == 0) {
    int n = 0;
    if (mmpDeviceGetAttribute(&n, mmpDevAttrMultiProcessorCount, dev) != mmpSuccess || n <= 0) n = 80;
    cached[dev] = n;
  }
  return cached[dev];
}
