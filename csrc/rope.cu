// Rotary position embedding, megatron-core's _apply_rotary_pos_emb_bshd semantics
// (models/common/embeddings/rope_utils.py, mscale = 1):
//   rot = freqs.shape[-1]; the first rot channels are rotated, the rest pass through;
//   out = t * cos(freqs) + rotate_half(t) * sin(freqs)
// Pairs: non-interleaved (i, i + rot/2), interleaved (2i, 2i + 1), i < rot/2. For a pair
// (x1, x2) with angles (fa, fb) at the two channels:
//   forward:  o1 = x1 cos fa - x2 sin fa,   o2 = x2 cos fb + x1 sin fb
//   backward: d1 = g1 cos fa + g2 sin fb,   d2 = g2 cos fb - g1 sin fa   (the transpose)
// cos/sin are either computed in fp32 from fp32 angles (accurate sincosf: angles reach 1e5 rad)
// or read from precomputed fp32 cos/sin tables of the same layout (the caller's mscale applied).
// Block = 32 x 8 threads: x walks the channels of a row, y picks the row. Two kernels: angles
// shared by all rows of a position (the usual [s, 1, 1, rot]) or per row (any broadcast).
#include "mmp_kernels.h"

namespace {

template <typename T, bool INTERLEAVED, bool BACKWARD, bool TABLES>
__global__ void __launch_bounds__(256) rope_kernel(const T* __restrict__ in, const float* __restrict__ freqs,
                            const float* __restrict__ sin_table, T* __restrict__ out,
                            int64_t d0, int64_t d1, int64_t d2, int64_t head_dim, int64_t rot_dim, int64_t fs0,
                            int64_t fs1, int64_t fs2) {
  const int64_t rows = d0 * d1 * d2;
  const int64_t half = rot_dim / 2;
  for (int64_t row = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; row < rows;
       row += (int64_t)gridDim.x * blockDim.y) {
    const int64_t i2 = row % d2;
    const int64_t i1 = (row / d2) % d1;
    const int64_t i0 = row / (d1 * d2);
    const int64_t foff = i0 * fs0 + i1 * fs1 + i2 * fs2;
    const float* f = freqs + foff;  // angles, or the cos table when TABLES
    const T* src = in + row * head_dim;
    T* dst = out + row * head_dim;
    for (int64_t p = threadIdx.x; p < half; p += blockDim.x) {
      const int64_t ca = INTERLEAVED ? 2 * p : p;
      const int64_t cb = INTERLEAVED ? 2 * p + 1 : p + half;
      float sa, cosa, sb, cosb;
      if (TABLES) {
        cosa = f[ca];
        cosb = f[cb];
        sa = sin_table[foff + ca];
        sb = sin_table[foff + cb];
      } else {
        sincosf(f[ca], &sa, &cosa);
        sincosf(f[cb], &sb, &cosb);
      }
      const float x1 = mmp_to_float<T>(src[ca]);
      const float x2 = mmp_to_float<T>(src[cb]);
      float o1, o2;
      if (BACKWARD) {
        o1 = x1 * cosa + x2 * sb;
        o2 = x2 * cosb - x1 * sa;
      } else {
        o1 = x1 * cosa - x2 * sa;
        o2 = x2 * cosb + x1 * sb;
      }
      dst[ca] = mmp_from_float<T>(o1);
      dst[cb] = mmp_from_float<T>(o2);
    }
    for (int64_t c = rot_dim + threadIdx.x; c < head_dim; c += blockDim.x) dst[c] = src[c];
  }
}

// Angles that depend on the first dim only (freqs [s, 1, 1, rot], megatron's layout): a block
// takes one position at a time; a thread computes cos/sin of its pairs once and applies them to
// all inner = d1 * d2 rows of that position (sincosf once per position, not once per row).
template <typename T, bool INTERLEAVED, bool BACKWARD, bool TABLES>
__global__ void __launch_bounds__(256) rope_shared_kernel(const T* __restrict__ in, const float* __restrict__ freqs,
                                   const float* __restrict__ sin_table, T* __restrict__ out, int64_t d0,
                                   int64_t inner, int64_t head_dim, int64_t rot_dim, int64_t fs0) {
  const int64_t half = rot_dim / 2;
  for (int64_t i0 = blockIdx.x; i0 < d0; i0 += gridDim.x) {
    const float* f = freqs + i0 * fs0;  // angles, or the cos table when TABLES
    const T* src0 = in + i0 * inner * head_dim;
    T* dst0 = out + i0 * inner * head_dim;
    for (int64_t p = threadIdx.x; p < half; p += blockDim.x) {
      const int64_t ca = INTERLEAVED ? 2 * p : p;
      const int64_t cb = INTERLEAVED ? 2 * p + 1 : p + half;
      float sa, cosa, sb, cosb;
      if (TABLES) {
        cosa = f[ca];
        cosb = f[cb];
        sa = sin_table[i0 * fs0 + ca];
        sb = sin_table[i0 * fs0 + cb];
      } else {
        sincosf(f[ca], &sa, &cosa);
        sincosf(f[cb], &sb, &cosb);
      }
      for (int64_t r = threadIdx.y; r < inner; r += blockDim.y) {
        const T* src = src0 + r * head_dim;
        T* dst = dst0 + r * head_dim;
        const float x1 = mmp_to_float<T>(src[ca]);
        const float x2 = mmp_to_float<T>(src[cb]);
        float o1, o2;
        if (BACKWARD) {
          o1 = x1 * cosa + x2 * sb;
          o2 = x2 * cosb - x1 * sa;
        } else {
          o1 = x1 * cosa - x2 * sa;
          o2 = x2 * cosb + x1 * sb;
        }
        dst[ca] = mmp_from_float<T>(o1);
        dst[cb] = mmp_from_float<T>(o2);
      }
    }
    if (rot_dim < head_dim)
      for (int64_t r = threadIdx.y; r < inner; r += blockDim.y)
        for (int64_t c = rot_dim + threadIdx.x; c < head_dim; c += blockDim.x)
          dst0[r * head_dim + c] = src0[r * head_dim + c];
  }
}

template <typename T, bool INTERLEAVED, bool BACKWARD>
void launch(const void* in, const float* freqs, const float* sin_table, void* out, int64_t d0, int64_t d1, int64_t d2, int64_t head_dim,
            int64_t rot_dim, int64_t fs0, int64_t fs1, int64_t fs2, mmpStream_t stream) {
  const dim3 block(32, 8);
  const int64_t inner = d1 * d2;
  if (fs1 == 0 && fs2 == 0 && inner >= 8 && d0 >= 32) {
    const int64_t cap_shared = (int64_t)mmp_num_sms() * 8;
    const unsigned sgrid = (unsigned)(d0 < cap_shared ? d0 : cap_shared);
    if (sin_table != nullptr)
      rope_shared_kernel<T, INTERLEAVED, BACKWARD, true><<<sgrid, block, 0, stream>>>(
          static_cast<const T*>(in), freqs, sin_table, static_cast<T*>(out), d0, inner, head_dim, rot_dim, fs0);
    else
      rope_shared_kernel<T, INTERLEAVED, BACKWARD, false><<<sgrid, block, 0, stream>>>(
          static_cast<const T*>(in), freqs, nullptr, static_cast<T*>(out), d0, inner, head_dim, rot_dim, fs0);
    return;
  }
  const int64_t rows = d0 * d1 * d2;
  const int64_t blocks = mmp_ceil_div(rows, 8);
  const int64_t cap = (int64_t)mmp_num_sms() * 64;
  const unsigned grid = (unsigned)(blocks < cap ? blocks : cap);
  if (sin_table != nullptr)
    rope_kernel<T, INTERLEAVED, BACKWARD, true><<<grid, block, 0, stream>>>(
        static_cast<const T*>(in), freqs, sin_table, static_cast<T*>(out), d0, d1, d2, head_dim, rot_dim, fs0, fs1,
        fs2);
  else
    rope_kernel<T, INTERLEAVED, BACKWARD, false><<<grid, block, 0, stream>>>(
        static_cast<const T*>(in), freqs, nullptr, static_cast<T*>(out), d0, d1, d2, head_dim, rot_dim, fs0, fs1,
        fs2);
}

template <typename T>
void launch_mode(const void* in, const float* freqs, const float* sin_table, void* out, int64_t d0, int64_t d1, int64_t d2,
                 int64_t head_dim, int64_t rot_dim, int64_t fs0, int64_t fs1, int64_t fs2, bool interleaved,
                 bool backward, mmpStream_t stream) {
  if (interleaved) {
    if (backward) launch<T, true, true>(in, freqs, sin_table, out, d0, d1, d2, head_dim, rot_dim, fs0, fs1, fs2, stream);
    else launch<T, true, false>(in, freqs, sin_table, out, d0, d1, d2, head_dim, rot_dim, fs0, fs1, fs2, stream);
  } else {
    if (backward) launch<T, false, true>(in, freqs, sin_table, out, d0, d1, d2, head_dim, rot_dim, fs0, fs1, fs2, stream);
    else launch<T, false, false>(in, freqs, sin_table, out, d0, d1, d2, head_dim, rot_dim, fs0, fs1, fs2, stream);
  }
}

}  // namespace

mmpError_t mmp_rope(const void* in, const float* freqs, const float* sin_table, void* out, int64_t d0, int64_t d1, int64_t d2,
                    int64_t head_dim, int64_t rot_dim, int64_t fs0, int64_t fs1, int64_t fs2, bool interleaved,
                    bool backward, MmpDtype t, mmpStream_t stream) {
  if (d0 * d1 * d2 <= 0 || head_dim <= 0) return mmpSuccess;
  if (rot_dim % 2 != 0 || rot_dim > head_dim || rot_dim < 0) return mmpErrorInvalidValue;
  switch (t) {
    case MMP_F32:
      launch_mode<float>(in, freqs, sin_table, out, d0, d1, d2, head_dim, rot_dim, fs0, fs1, fs2, interleaved, backward, stream);
      break;
    case MMP_F16:
      launch_mode<mmp_fp16>(in, freqs, sin_table, out, d0, d1, d2, head_dim, rot_dim, fs0, fs1, fs2, interleaved, backward, stream);
      break;
    case MMP_BF16:
      launch_mode<mmp_bf16>(in, freqs, sin_table, out, d0, d1, d2, head_dim, rot_dim, fs0, fs1, fs2, interleaved, backward, stream);
      break;
    default:
      return mmpErrorInvalidValue;
  }
  return mmpGetLastError();
}
