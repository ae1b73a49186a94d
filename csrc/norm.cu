// RMSNorm and LayerNorm, forward and backward, over the last dimension.
//
// Forward: one block per row (grid-stride), fp32 block reductions, vectorised 16-byte access when
// `cols` and the pointers allow it. Statistics (mean, rstd) are written in fp32 for the backward.
// Backward: each block walks a fixed set of rows; a thread owns the same columns in every row,
// so the weight (and bias) gradient is summed in registers and written once per block into an
// fp32 workspace [G, cols], which a second kernel reduces over G. Very wide rows that would need
// too many registers use a column kernel for the weight gradient instead.
#include "mmp_kernels.h"

namespace {

constexpr int kMaxK = 8;        // column chunks per thread kept in registers in the backward
constexpr int kMaxAcc = 32;     // fp32 accumulators per thread and per gradient (dw, db)
constexpr int kFwdThreads = 512;
constexpr int kBwdThreads = 512;

template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kFwdThreads) rms_norm_fwd_kernel(const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ y,
                                    float* __restrict__ rstd, int64_t rows, int64_t cols, float eps) {
  __shared__ float smem[MMP_REDUCE_SMEM_PER_VALUE];
  const int64_t nvec = cols / VEC;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * cols;
    T* yr = y + row * cols;
    float sq[1] = {0.f};
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
      float xv[VEC];
      mmp_load<T, VEC>(xr, i, xv);
#pragma unroll
      for (int j = 0; j < VEC; ++j) sq[0] += xv[j] * xv[j];
    }
    mmp_block_sum<1>(sq, smem);
    const float r = 1.f / sqrtf(sq[0] / (float)cols + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
      float xv[VEC], wv[VEC], yv[VEC];
      mmp_load<T, VEC>(xr, i, xv);
      mmp_load<W, VEC>(w, i, wv);
#pragma unroll
      for (int j = 0; j < VEC; ++j) yv[j] = xv[j] * r * wv[j];
      mmp_store<T, VEC>(yr, i, yv);
    }
  }
}

template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kFwdThreads) layer_norm_fwd_kernel(const T* __restrict__ x, const W* __restrict__ w,
                                      const W* __restrict__ b, T* __restrict__ y, float* __restrict__ mean,
                                      float* __restrict__ rstd, int64_t rows, int64_t cols, float eps) {
  __shared__ float smem[MMP_REDUCE_SMEM_PER_VALUE];
  const int64_t nvec = cols / VEC;
  const float inv_n = 1.f / (float)cols;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * cols;
    T* yr = y + row * cols;
    float s[1] = {0.f};
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
      float xv[VEC];
      mmp_load<T, VEC>(xr, i, xv);
#pragma unroll
      for (int j = 0; j < VEC; ++j) s[0] += xv[j];
    }
    mmp_block_sum<1>(s, smem);
    const float mu = s[0] * inv_n;
    // second pass over the (cached) row: centred sum of squares, no cancellation
    float v[1] = {0.f};
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
      float xv[VEC];
      mmp_load<T, VEC>(xr, i, xv);
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[0] += (xv[j] - mu) * (xv[j] - mu);
    }
    mmp_block_sum<1>(v, smem);
    const float r = 1.f / sqrtf(v[0] * inv_n + eps);
    if (threadIdx.x == 0) {
      mean[row] = mu;
      rstd[row] = r;
    }
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
      float xv[VEC], wv[VEC], bv[VEC], yv[VEC];
      mmp_load<T, VEC>(xr, i, xv);
      mmp_load<W, VEC>(w, i, wv);
      if (b != nullptr) {
        mmp_load<W, VEC>(b, i, bv);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) bv[j] = 0.f;
      }
#pragma unroll
      for (int j = 0; j < VEC; ++j) yv[j] = (xv[j] - mu) * r * wv[j] + bv[j];
      mmp_store<T, VEC>(yr, i, yv);
    }
  }
}

// Backward of both norms. xhat = (x - mean) * rstd (mean = 0 for RMSNorm), g = dy * w:
//   LayerNorm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   RMSNorm:   dx = rstd * (g - xhat * mean(g * xhat))
//   dw = sum_rows dy * xhat, db = sum_rows dy.
// K > 0: thread owns vectors threadIdx.x + k * blockDim.x (k < K) in every row and keeps the dw/db
// partial sums in registers (requires nvec <= K * blockDim.x). K == 0: plain strided loop, the
// weight gradient is left to norm_bwd_columns_kernel.
template <typename T, typename W, int VEC, int K, bool LN>
__global__ void __launch_bounds__(kBwdThreads) norm_bwd_kernel(const T* __restrict__ dy, const T* __restrict__ x, const W* __restrict__ w,
                                const float* __restrict__ mean, const float* __restrict__ rstd,
                                T* __restrict__ dx, float* __restrict__ part, int64_t rows, int64_t cols) {
  __shared__ float smem[2 * MMP_REDUCE_SMEM_PER_VALUE];
  const int64_t nvec = cols / VEC;
  const float inv_n = 1.f / (float)cols;
  constexpr int KA = K > 0 ? K : 1;
  float acc_w[KA][VEC];
  float acc_b[KA][VEC];
#pragma unroll
  for (int k = 0; k < KA; ++k)
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc_w[k][j] = acc_b[k][j] = 0.f;

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* dyr = dy + row * cols;
    const T* xr = x + row * cols;
    T* dxr = dx + row * cols;
    const float r = rstd[row];
    const float mu = LN ? mean[row] : 0.f;
    float red[2] = {0.f, 0.f};
    if (K > 0) {
#pragma unroll
      for (int k = 0; k < KA; ++k) {
        const int64_t i = threadIdx.x + (int64_t)k * blockDim.x;
        if (i < nvec) {
          float dv[VEC], xv[VEC], wv[VEC];
          mmp_load<T, VEC>(dyr, i, dv);
          mmp_load<T, VEC>(xr, i, xv);
          mmp_load<W, VEC>(w, i, wv);
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float g = dv[j] * wv[j];
            red[0] += g;
            red[1] += g * (xv[j] - mu) * r;
          }
        }
      }
    } else {
      for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
        float dv[VEC], xv[VEC], wv[VEC];
        mmp_load<T, VEC>(dyr, i, dv);
        mmp_load<T, VEC>(xr, i, xv);
        mmp_load<W, VEC>(w, i, wv);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float g = dv[j] * wv[j];
          red[0] += g;
          red[1] += g * (xv[j] - mu) * r;
        }
      }
    }
    mmp_block_sum<2>(red, smem);
    const float mean_g = LN ? red[0] * inv_n : 0.f;
    const float mean_gx = red[1] * inv_n;
    if (K > 0) {
#pragma unroll
      for (int k = 0; k < KA; ++k) {
        const int64_t i = threadIdx.x + (int64_t)k * blockDim.x;
        if (i < nvec) {
          float dv[VEC], xv[VEC], wv[VEC], out[VEC];
          mmp_load<T, VEC>(dyr, i, dv);
          mmp_load<T, VEC>(xr, i, xv);
          mmp_load<W, VEC>(w, i, wv);
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float xh = (xv[j] - mu) * r;
            out[j] = r * (dv[j] * wv[j] - mean_g - xh * mean_gx);
            acc_w[k][j] += dv[j] * xh;
            acc_b[k][j] += dv[j];
          }
          mmp_store<T, VEC>(dxr, i, out);
        }
      }
    } else {
      for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
        float dv[VEC], xv[VEC], wv[VEC], out[VEC];
        mmp_load<T, VEC>(dyr, i, dv);
        mmp_load<T, VEC>(xr, i, xv);
        mmp_load<W, VEC>(w, i, wv);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float xh = (xv[j] - mu) * r;
          out[j] = r * (dv[j] * wv[j] - mean_g - xh * mean_gx);
        }
        mmp_store<T, VEC>(dxr, i, out);
      }
    }
  }

  if (K > 0) {
    const int64_t plane = (int64_t)gridDim.x * cols;
#pragma unroll
    for (int k = 0; k < KA; ++k) {
      const int64_t i = threadIdx.x + (int64_t)k * blockDim.x;
      if (i < nvec) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const int64_t c = i * VEC + j;
          part[blockIdx.x * cols + c] = acc_w[k][j];
          if (LN) part[plane + blockIdx.x * cols + c] = acc_b[k][j];
        }
      }
    }
  }
}

// Weight/bias gradient partials for rows too wide for register accumulation: thread per column,
// rows split over gridDim.y.
template <typename T, bool LN>
__global__ void __launch_bounds__(256) norm_bwd_columns_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                        const float* __restrict__ mean, const float* __restrict__ rstd,
                                        float* __restrict__ part, int64_t rows, int64_t cols) {
  const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float aw = 0.f, ab = 0.f;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const float d = mmp_to_float<T>(dy[row * cols + c]);
    const float mu = LN ? mean[row] : 0.f;
    aw += d * (mmp_to_float<T>(x[row * cols + c]) - mu) * rstd[row];
    ab += d;
  }
  part[(int64_t)blockIdx.y * cols + c] = aw;
  if (LN) part[(int64_t)gridDim.y * cols + (int64_t)blockIdx.y * cols + c] = ab;
}

template <typename W>
__global__ void __launch_bounds__(256) column_sum_kernel(const float* __restrict__ part, W* __restrict__ out, int64_t groups,
                                  int64_t cols) {
  const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0.f;
  for (int64_t g = 0; g < groups; ++g) s += part[g * cols + c];
  out[c] = mmp_from_float<W>(s);
}

// ---- launch plans ------------------------------------------------------------------------------

int64_t bwd_groups(int64_t rows) {
  const int64_t g = 4 * (int64_t)mmp_num_sms();
  return rows < g ? rows : g;
}

int fwd_grid(int64_t rows) {
  const int64_t cap = 1 << 20;
  return (int)(rows < cap ? rows : cap);
}

template <typename T, typename W, int VEC>
mmpError_t rms_fwd_vec(const T* x, const W* w, T* y, float* rstd, int64_t rows, int64_t cols, float eps,
                       mmpStream_t stream) {
  const int threads = mmp_pow2_at_least(cols / VEC, 32, kFwdThreads);
  rms_norm_fwd_kernel<T, W, VEC><<<fwd_grid(rows), threads, 0, stream>>>(x, w, y, rstd, rows, cols, eps);
  return mmpGetLastError();
}

template <typename T, typename W, int VEC>
mmpError_t ln_fwd_vec(const T* x, const W* w, const W* b, T* y, float* mean, float* rstd, int64_t rows,
                      int64_t cols, float eps, mmpStream_t stream) {
  const int threads = mmp_pow2_at_least(cols / VEC, 32, kFwdThreads);
  layer_norm_fwd_kernel<T, W, VEC>
      <<<fwd_grid(rows), threads, 0, stream>>>(x, w, b, y, mean, rstd, rows, cols, eps);
  return mmpGetLastError();
}

template <typename T, typename W>
int pick_vec(int64_t cols, const void* a, const void* b, const void* c, const void* d) {
  const void* ptrs[4] = {a, b, c, d};
  const int sizes[4] = {(int)sizeof(T), (int)sizeof(T), (int)sizeof(T), (int)sizeof(W)};
  return mmp_pick_vec(cols, 16 / (int)sizeof(T), ptrs, sizes, 4);
}

template <typename T, typename W>
mmpError_t rms_fwd_typed(const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t cols,
                         float eps, mmpStream_t stream) {
  const T* xp = static_cast<const T*>(x);
  const W* wp = static_cast<const W*>(w);
  T* yp = static_cast<T*>(y);
  switch (pick_vec<T, W>(cols, x, y, nullptr, w)) {
    case 1: return rms_fwd_vec<T, W, 1>(xp, wp, yp, rstd, rows, cols, eps, stream);
    default: return rms_fwd_vec<T, W, MmpMaxVec<T>::value>(xp, wp, yp, rstd, rows, cols, eps, stream);
  }
}

template <typename T, typename W>
mmpError_t ln_fwd_typed(const void* x, const void* w, const void* b, void* y, float* mean, float* rstd,
                        int64_t rows, int64_t cols, float eps, mmpStream_t stream) {
  const T* xp = static_cast<const T*>(x);
  const W* wp = static_cast<const W*>(w);
  const W* bp = static_cast<const W*>(b);
  T* yp = static_cast<T*>(y);
  int vec = pick_vec<T, W>(cols, x, y, nullptr, w);
  if (b != nullptr) {
    const int vb = pick_vec<T, W>(cols, nullptr, nullptr, nullptr, b);
    vec = vb < vec ? vb : vec;
  }
  switch (vec) {
    case 1: return ln_fwd_vec<T, W, 1>(xp, wp, bp, yp, mean, rstd, rows, cols, eps, stream);
    default: return ln_fwd_vec<T, W, MmpMaxVec<T>::value>(xp, wp, bp, yp, mean, rstd, rows, cols, eps, stream);
  }
}

// Register-accumulating backward for one (VEC, K) choice, then the reduction over groups.
template <typename T, typename W, int VEC, bool LN>
mmpError_t norm_bwd_vec(const T* dy, const T* x, const W* w, const float* mean, const float* rstd, T* dx,
                        W* dw, W* db, float* part, int64_t rows, int64_t cols, mmpStream_t stream) {
  const int64_t nvec = cols / VEC;
  const int64_t groups = bwd_groups(rows);
  // At most kMaxAcc fp32 accumulators per set per thread, so the kernel fits its
  // __launch_bounds__(kBwdThreads) register budget without spilling.
  const int threads = mmp_pow2_at_least(nvec, 32, kBwdThreads);
  const int k = mmp_pow2_at_least(mmp_ceil_div(nvec, threads), 1, 1 << 30);
  const bool registers = k <= kMaxK && k * VEC <= kMaxAcc;
  const int grid = (int)groups;
  if (registers) {
    // only the (K, VEC) pairs within the register budget are instantiated
    if (k == 1) {
      norm_bwd_kernel<T, W, VEC, 1, LN><<<grid, threads, 0, stream>>>(dy, x, w, mean, rstd, dx, part, rows, cols);
    } else if (k == 2) {
      if constexpr (2 * VEC <= kMaxAcc)
        norm_bwd_kernel<T, W, VEC, 2, LN><<<grid, threads, 0, stream>>>(dy, x, w, mean, rstd, dx, part, rows, cols);
    } else if (k == 4) {
      if constexpr (4 * VEC <= kMaxAcc)
        norm_bwd_kernel<T, W, VEC, 4, LN><<<grid, threads, 0, stream>>>(dy, x, w, mean, rstd, dx, part, rows, cols);
    } else {
      if constexpr (8 * VEC <= kMaxAcc)
        norm_bwd_kernel<T, W, VEC, 8, LN><<<grid, threads, 0, stream>>>(dy, x, w, mean, rstd, dx, part, rows, cols);
    }
  } else {
    norm_bwd_kernel<T, W, VEC, 0, LN>
        <<<fwd_grid(rows), kBwdThreads, 0, stream>>>(dy, x, w, mean, rstd, dx, part, rows, cols);
    dim3 cgrid((unsigned)mmp_ceil_div(cols, 256), (unsigned)groups);
    norm_bwd_columns_kernel<T, LN><<<cgrid, 256, 0, stream>>>(dy, x, mean, rstd, part, rows, cols);
  }
  mmpError_t err = mmpGetLastError();
  if (err != mmpSuccess) return err;
  const unsigned rgrid = (unsigned)mmp_ceil_div(cols, 256);
  column_sum_kernel<W><<<rgrid, 256, 0, stream>>>(part, dw, groups, cols);
  if (LN) column_sum_kernel<W><<<rgrid, 256, 0, stream>>>(part + groups * cols, db, groups, cols);
  return mmpGetLastError();
}

template <typename T, typename W, bool LN>
mmpError_t norm_bwd_typed(const void* dy, const void* x, const void* w, const float* mean, const float* rstd,
                          void* dx, void* dw, void* db, float* part, int64_t rows, int64_t cols,
                          mmpStream_t stream) {
  const T* dyp = static_cast<const T*>(dy);
  const T* xp = static_cast<const T*>(x);
  const W* wp = static_cast<const W*>(w);
  T* dxp = static_cast<T*>(dx);
  W* dwp = static_cast<W*>(dw);
  W* dbp = static_cast<W*>(db);
  switch (pick_vec<T, W>(cols, dy, x, dx, w)) {
    case 1: return norm_bwd_vec<T, W, 1, LN>(dyp, xp, wp, mean, rstd, dxp, dwp, dbp, part, rows, cols, stream);
    default: return norm_bwd_vec<T, W, MmpMaxVec<T>::value, LN>(dyp, xp, wp, mean, rstd, dxp, dwp, dbp, part, rows, cols, stream);
  }
}

}  // namespace

// Weight dtype is the input dtype or fp32 (mixed-precision norms); anything else is rejected.
#define MMP_DISPATCH_XW(XT, WT, FN, ...)                                              \
  do {                                                                                \
    if ((XT) == MMP_F32 && (WT) == MMP_F32) return FN<float, float>(__VA_ARGS__);     \
    if ((XT) == MMP_F16 && (WT) == MMP_F16) return FN<mmp_fp16, mmp_fp16>(__VA_ARGS__); \
    if ((XT) == MMP_F16 && (WT) == MMP_F32) return FN<mmp_fp16, float>(__VA_ARGS__);  \
    if ((XT) == MMP_BF16 && (WT) == MMP_BF16) return FN<mmp_bf16, mmp_bf16>(__VA_ARGS__); \
    if ((XT) == MMP_BF16 && (WT) == MMP_F32) return FN<mmp_bf16, float>(__VA_ARGS__); \
    return mmpErrorInvalidValue;                                                      \
  } while (0)

mmpError_t mmp_rms_norm_fwd(const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t cols,
                            float eps, MmpDtype xt, MmpDtype wt, mmpStream_t stream) {
  if (rows <= 0) return mmpSuccess;
  MMP_DISPATCH_XW(xt, wt, rms_fwd_typed, x, w, y, rstd, rows, cols, eps, stream);
}

mmpError_t mmp_layer_norm_fwd(const void* x, const void* w, const void* b, void* y, float* mean, float* rstd,
                              int64_t rows, int64_t cols, float eps, MmpDtype xt, MmpDtype wt,
                              mmpStream_t stream) {
  if (rows <= 0) return mmpSuccess;
  MMP_DISPATCH_XW(xt, wt, ln_fwd_typed, x, w, b, y, mean, rstd, rows, cols, eps, stream);
}

int64_t mmp_norm_bwd_partial_rows(int64_t rows, int64_t /*cols*/, MmpDtype /*xt*/, MmpDtype /*wt*/,
                                  bool /*layer_norm*/) {
  return rows > 0 ? bwd_groups(rows) : 1;
}

template <typename T, typename W>
static mmpError_t rms_bwd_entry(const void* dy, const void* x, const void* w, const float* rstd, void* dx,
                                void* dw, float* part, int64_t rows, int64_t cols, mmpStream_t stream) {
  return norm_bwd_typed<T, W, false>(dy, x, w, nullptr, rstd, dx, dw, nullptr, part, rows, cols, stream);
}

template <typename T, typename W>
static mmpError_t ln_bwd_entry(const void* dy, const void* x, const void* w, const float* mean,
                               const float* rstd, void* dx, void* dw, void* db, float* part, int64_t rows,
                               int64_t cols, mmpStream_t stream) {
  return norm_bwd_typed<T, W, true>(dy, x, w, mean, rstd, dx, dw, db, part, rows, cols, stream);
}

mmpError_t mmp_rms_norm_bwd(const void* dy, const void* x, const void* w, const float* rstd, void* dx, void* dw,
                            float* workspace, int64_t rows, int64_t cols, MmpDtype xt, MmpDtype wt,
                            mmpStream_t stream) {
  if (rows <= 0) return mmpSuccess;  // the binding zero-fills dw
  MMP_DISPATCH_XW(xt, wt, rms_bwd_entry, dy, x, w, rstd, dx, dw, workspace, rows, cols, stream);
}

mmpError_t mmp_layer_norm_bwd(const void* dy, const void* x, const void* w, const float* mean, const float* rstd,
                              void* dx, void* dw, void* db, float* workspace, int64_t rows, int64_t cols,
                              MmpDtype xt, MmpDtype wt, mmpStream_t stream) {
  if (rows <= 0) return mmpSuccess;
  MMP_DISPATCH_XW(xt, wt, ln_bwd_entry, dy, x, w, mean, rstd, dx, dw, db, workspace, rows, cols, stream);
}
