// SwiGLU over the last dimension, megatron-core's convention (fusions/fused_bias_swiglu.py):
//   x = [rows, 2f],  a = x[:, :f] (gated half), b = x[:, f:]
//   y = silu(a) * b
//   dx[:, :f] = dy * b * sigmoid(a) * (1 + a * (1 - sigmoid(a)))
//   dx[:, f:] = dy * silu(a)
// Elementwise over rows x (f / VEC) vectors, math in fp32.
#include "mmp_kernels.h"

namespace {

MMP_DEVICE float sigmoidf_(float a) { return 1.f / (1.f + expf(-a)); }

// 2-D grid-stride: y walks rows, x walks the vectors of a row (no 64-bit division per element).
template <typename T, int VEC>
__global__ void __launch_bounds__(256) swiglu_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows,
                                                         int64_t f) {
  const int64_t vrow = f / VEC;  // vectors per output row
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const T* xr = x + row * 2 * f;
    T* yr = y + row * f;
    for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < vrow; v += (int64_t)gridDim.x * blockDim.x) {
      float a[VEC], b[VEC], out[VEC];
      mmp_load<T, VEC>(xr, v, a);
      mmp_load<T, VEC>(xr + f, v, b);
#pragma unroll
      for (int j = 0; j < VEC; ++j) out[j] = a[j] * sigmoidf_(a[j]) * b[j];
      mmp_store<T, VEC>(yr, v, out);
    }
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(256) swiglu_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                                         T* __restrict__ dx, int64_t rows, int64_t f) {
  const int64_t vrow = f / VEC;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const T* xr = x + row * 2 * f;
    const T* gr = dy + row * f;
    T* dxr = dx + row * 2 * f;
    for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < vrow; v += (int64_t)gridDim.x * blockDim.x) {
      float a[VEC], b[VEC], g[VEC], da[VEC], db[VEC];
      mmp_load<T, VEC>(xr, v, a);
      mmp_load<T, VEC>(xr + f, v, b);
      mmp_load<T, VEC>(gr, v, g);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float s = sigmoidf_(a[j]);
        da[j] = g[j] * b[j] * s * (1.f + a[j] * (1.f - s));
        db[j] = g[j] * a[j] * s;
      }
      mmp_store<T, VEC>(dxr, v, da);
      mmp_store<T, VEC>(dxr + f, v, db);
    }
  }
}

dim3 elementwise_grid(int64_t rows, int64_t vrow, int threads) {
  const int64_t gx = mmp_ceil_div(vrow, threads);
  const int64_t cap_x = 1 << 16;
  const int64_t cap_y = 65535;
  return dim3((unsigned)(gx < cap_x ? gx : cap_x), (unsigned)(rows < cap_y ? rows : cap_y));
}

// Vector width: f must divide and every row start (x + row * 2f, y + row * f) stays aligned.
template <typename T>
int swiglu_vec(int64_t f, const void* a, const void* b, const void* c) {
  const void* ptrs[3] = {a, b, c};
  const int sizes[3] = {(int)sizeof(T), (int)sizeof(T), (int)sizeof(T)};
  return mmp_pick_vec(f, 16 / (int)sizeof(T), ptrs, sizes, 3);
}

template <typename T>
mmpError_t fwd_typed(const void* x, void* y, int64_t rows, int64_t f, mmpStream_t stream) {
  const T* xp = static_cast<const T*>(x);
  T* yp = static_cast<T*>(y);
  const int threads = 256;
  switch (swiglu_vec<T>(f, x, y, nullptr)) {
    case 1: swiglu_fwd_kernel<T, 1><<<elementwise_grid(rows, f, threads), threads, 0, stream>>>(xp, yp, rows, f); break;
    default: swiglu_fwd_kernel<T, MmpMaxVec<T>::value><<<elementwise_grid(rows, f / MmpMaxVec<T>::value, threads), threads, 0, stream>>>(xp, yp, rows, f); break;
  }
  return mmpGetLastError();
}

template <typename T>
mmpError_t bwd_typed(const void* dy, const void* x, void* dx, int64_t rows, int64_t f, mmpStream_t stream) {
  const T* dyp = static_cast<const T*>(dy);
  const T* xp = static_cast<const T*>(x);
  T* dxp = static_cast<T*>(dx);
  const int threads = 256;
  switch (swiglu_vec<T>(f, dy, x, dx)) {
    case 1: swiglu_bwd_kernel<T, 1><<<elementwise_grid(rows, f, threads), threads, 0, stream>>>(dyp, xp, dxp, rows, f); break;
    default: swiglu_bwd_kernel<T, MmpMaxVec<T>::value><<<elementwise_grid(rows, f / MmpMaxVec<T>::value, threads), threads, 0, stream>>>(dyp, xp, dxp, rows, f); break;
  }
  return mmpGetLastError();
}

}  // namespace

mmpError_t mmp_swiglu_fwd(const void* x, void* y, int64_t rows, int64_t f, MmpDtype t, mmpStream_t stream) {
  if (rows <= 0 || f <= 0) return mmpSuccess;
  switch (t) {
    case MMP_F32: return fwd_typed<float>(x, y, rows, f, stream);
    case MMP_F16: return fwd_typed<mmp_fp16>(x, y, rows, f, stream);
    case MMP_BF16: return fwd_typed<mmp_bf16>(x, y, rows, f, stream);
  }
  return mmpErrorInvalidValue;
}

mmpError_t mmp_swiglu_bwd(const void* dy, const void* x, void* dx, int64_t rows, int64_t f, MmpDtype t,
                          mmpStream_t stream) {
  if (rows <= 0 || f <= 0) return mmpSuccess;
  switch (t) {
    case MMP_F32: return bwd_typed<float>(dy, x, dx, rows, f, stream);
    case MMP_F16: return bwd_typed<mmp_fp16>(dy, x, dx, rows, f, stream);
    case MMP_BF16: return bwd_typed<mmp_bf16>(dy, x, dx, rows, f, stream);
  }
  return mmpErrorInvalidValue;
}
