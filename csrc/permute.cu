// MoE token permute / unpermute with megatron-core's non-fused semantics
// (transformer/moe/moe_utils.py: permute / unpermute, drop_and_pad=False):
//   permute:   sorted_indices = token ids grouped by expert (expert-major, tokens ascending),
//              permuted = tokens[sorted_indices], permuted_probs = probs.T[routing_map.T]
//   unpermute: out = zeros(restore_shape); out[sorted_indices[p]] += permuted[p] * probs[p]
// The unpermute sums each token's rows in ascending p order in fp32 (deterministic, no atomics
// on floating point), then rounds once to the output dtype.
#include "mmp_kernels.h"

namespace {

int grid_for(int64_t work, int threads, int per_sm) {
  const int64_t blocks = mmp_ceil_div(work, threads);
  const int64_t cap = (int64_t)mmp_num_sms() * per_sm;
  return (int)(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}

__global__ void __launch_bounds__(256) permute_index_kernel(const uint8_t* __restrict__ map_t, const int32_t* __restrict__ positions,
                                     int64_t num_tokens, int64_t num_experts, int64_t num_out,
                                     const float* __restrict__ probs, int64_t* __restrict__ sorted_indices,
                                     float* __restrict__ permuted_probs) {
  const int64_t total = num_tokens * num_experts;
  for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    if (!map_t[idx]) continue;
    const int64_t pos = (int64_t)positions[idx] - 1;
    if (pos < 0 || pos >= num_out) continue;
    const int64_t expert = idx / num_tokens;
    const int64_t token = idx - expert * num_tokens;
    sorted_indices[pos] = token;
    if (probs != nullptr) permuted_probs[pos] = probs[token * num_experts + expert];
  }
}

// One block per output row (grid-stride over rows), vectorised copy of the hidden vector.
template <typename T, int VEC>
__global__ void __launch_bounds__(256) gather_rows_kernel(const T* __restrict__ tokens, const int64_t* __restrict__ index,
                                   T* __restrict__ out, int64_t num_out, int64_t num_tokens, int64_t hidden) {
  using V = MmpVec<T, VEC>;
  const int64_t nvec = hidden / VEC;
  for (int64_t p = blockIdx.x; p < num_out; p += gridDim.x) {
    const int64_t src = index[p];
    V* dst = reinterpret_cast<V*>(out + p * hidden);
    if (src < 0 || src >= num_tokens) {  // never produced by permute; keep the row defined
      V zero;
#pragma unroll
      for (int j = 0; j < VEC; ++j) zero.v[j] = mmp_from_float<T>(0.f);
      for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) dst[i] = zero;
      continue;
    }
    const V* s = reinterpret_cast<const V*>(tokens + src * hidden);
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) dst[i] = s[i];
  }
}

__global__ void __launch_bounds__(256) count_kernel(const int64_t* __restrict__ index, int64_t n, int64_t num_tokens,
                             int32_t* __restrict__ counts) {
  for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < n; p += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = index[p];
    if (t >= 0 && t < num_tokens) atomicAdd(&counts[t], 1);
  }
}

__global__ void __launch_bounds__(256) fill_rows_kernel(const int64_t* __restrict__ index, int64_t n, int64_t num_tokens,
                                 const int32_t* __restrict__ offsets, int32_t* __restrict__ cursor,
                                 int32_t* __restrict__ rows_by_token) {
  for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < n; p += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = index[p];
    if (t < 0 || t >= num_tokens) continue;
    const int32_t slot = atomicAdd(&cursor[t], 1);
    rows_by_token[offsets[t] + slot] = (int32_t)p;
  }
}

// Each token's rows arrive in arbitrary order from the atomics; sort them (a token has at most
// top-k rows, so insertion sort) to make the summation order fixed.
__global__ void __launch_bounds__(256) sort_rows_kernel(const int32_t* __restrict__ offsets, const int32_t* __restrict__ counts,
                                 int32_t* __restrict__ rows_by_token, int64_t num_tokens) {
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < num_tokens;
       t += (int64_t)gridDim.x * blockDim.x) {
    int32_t* r = rows_by_token + offsets[t];
    const int n = counts[t];
    for (int i = 1; i < n; ++i) {
      const int32_t v = r[i];
      int j = i - 1;
      while (j >= 0 && r[j] > v) {
        r[j + 1] = r[j];
        --j;
      }
      r[j + 1] = v;
    }
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(256) unpermute_reduce_kernel(const T* __restrict__ permuted, const float* __restrict__ probs,
                                        const int32_t* __restrict__ offsets, const int32_t* __restrict__ counts,
                                        const int32_t* __restrict__ rows_by_token, T* __restrict__ out,
                                        int64_t num_tokens, int64_t hidden) {
  const int64_t nvec = hidden / VEC;
  for (int64_t t = blockIdx.x; t < num_tokens; t += gridDim.x) {
    const int32_t* r = rows_by_token + offsets[t];
    const int n = counts[t];
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
      float acc[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[j] = 0.f;
      for (int k = 0; k < n; ++k) {
        const int64_t p = r[k];
        const float scale = probs != nullptr ? probs[p] : 1.f;
        float v[VEC];
        mmp_load<T, VEC>(permuted + p * hidden, i, v);
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[j] += v[j] * scale;
      }
      mmp_store<T, VEC>(out + t * hidden, i, acc);
    }
  }
}

template <typename T>
int row_vec(int64_t hidden, const void* a, const void* b) {
  const void* ptrs[2] = {a, b};
  const int sizes[2] = {(int)sizeof(T), (int)sizeof(T)};
  return mmp_pick_vec(hidden, 16 / (int)sizeof(T), ptrs, sizes, 2);
}

int row_threads(int64_t nvec) { return mmp_pow2_at_least(nvec, 32, 256); }

template <typename T>
mmpError_t gather_typed(const void* tokens, const int64_t* index, void* out, int64_t num_out, int64_t num_tokens,
                        int64_t hidden, mmpStream_t stream) {
  const T* src = static_cast<const T*>(tokens);
  T* dst = static_cast<T*>(out);
  const int vec = row_vec<T>(hidden, tokens, out);
  const int threads = row_threads(hidden / vec);
  const int64_t cap = 1 << 20;
  const int grid = (int)(num_out < cap ? num_out : cap);
  switch (vec) {
    case 1: gather_rows_kernel<T, 1><<<grid, threads, 0, stream>>>(src, index, dst, num_out, num_tokens, hidden); break;
    default: gather_rows_kernel<T, MmpMaxVec<T>::value><<<grid, threads, 0, stream>>>(src, index, dst, num_out, num_tokens, hidden); break;
  }
  return mmpGetLastError();
}

template <typename T>
mmpError_t reduce_typed(const void* permuted, const float* probs, const int32_t* offsets, const int32_t* counts,
                        const int32_t* rows_by_token, void* out, int64_t num_tokens, int64_t hidden,
                        mmpStream_t stream) {
  const T* src = static_cast<const T*>(permuted);
  T* dst = static_cast<T*>(out);
  const int vec = row_vec<T>(hidden, permuted, out);
  const int threads = row_threads(hidden / vec);
  const int64_t cap = 1 << 20;
  const int grid = (int)(num_tokens < cap ? num_tokens : cap);
  switch (vec) {
    case 1: unpermute_reduce_kernel<T, 1><<<grid, threads, 0, stream>>>(src, probs, offsets, counts, rows_by_token, dst, num_tokens, hidden); break;
    default: unpermute_reduce_kernel<T, MmpMaxVec<T>::value><<<grid, threads, 0, stream>>>(src, probs, offsets, counts, rows_by_token, dst, num_tokens, hidden); break;
  }
  return mmpGetLastError();
}

}  // namespace

mmpError_t mmp_permute_index(const uint8_t* routing_map_t, const int32_t* positions, int64_t num_tokens,
                             int64_t num_experts, int64_t num_out, const float* probs, int64_t* sorted_indices,
                             float* permuted_probs, mmpStream_t stream) {
  const int64_t total = num_tokens * num_experts;
  if (total <= 0 || num_out <= 0) return mmpSuccess;
  permute_index_kernel<<<grid_for(total, 256, 16), 256, 0, stream>>>(
      routing_map_t, positions, num_tokens, num_experts, num_out, probs, sorted_indices, permuted_probs);
  return mmpGetLastError();
}

mmpError_t mmp_gather_rows(const void* tokens, const int64_t* sorted_indices, void* out, int64_t num_out,
                           int64_t num_tokens, int64_t hidden, MmpDtype t, mmpStream_t stream) {
  if (num_out <= 0 || hidden <= 0) return mmpSuccess;
  switch (t) {
    case MMP_F32: return gather_typed<float>(tokens, sorted_indices, out, num_out, num_tokens, hidden, stream);
    case MMP_F16: return gather_typed<mmp_fp16>(tokens, sorted_indices, out, num_out, num_tokens, hidden, stream);
    case MMP_BF16: return gather_typed<mmp_bf16>(tokens, sorted_indices, out, num_out, num_tokens, hidden, stream);
  }
  return mmpErrorInvalidValue;
}

mmpError_t mmp_unpermute_count(const int64_t* sorted_indices, int64_t num_permuted, int64_t num_tokens,
                               int32_t* counts, mmpStream_t stream) {
  if (num_permuted <= 0) return mmpSuccess;
  count_kernel<<<grid_for(num_permuted, 256, 16), 256, 0, stream>>>(sorted_indices, num_permuted, num_tokens,
                                                                      counts);
  return mmpGetLastError();
}

mmpError_t mmp_unpermute_reduce(const void* permuted, const int64_t* sorted_indices, const float* probs,
                                const int32_t* offsets, int32_t* cursor, int32_t* rows_by_token, void* out,
                                int64_t num_permuted, int64_t num_tokens, int64_t hidden, MmpDtype t,
                                mmpStream_t stream) {
  if (num_tokens <= 0 || hidden <= 0) return mmpSuccess;
  // `cursor` comes in zeroed; after fill_rows it holds each token's row count (= counts).
  if (num_permuted > 0) {
    fill_rows_kernel<<<grid_for(num_permuted, 256, 16), 256, 0, stream>>>(sorted_indices, num_permuted,
                                                                            num_tokens, offsets, cursor,
                                                                            rows_by_token);
    sort_rows_kernel<<<grid_for(num_tokens, 256, 16), 256, 0, stream>>>(offsets, cursor, rows_by_token,
                                                                          num_tokens);
  }
  mmpError_t err = mmpGetLastError();
  if (err != mmpSuccess) return err;
  switch (t) {
    case MMP_F32: return reduce_typed<float>(permuted, probs, offsets, cursor, rows_by_token, out, num_tokens, hidden, stream);
    case MMP_F16: return reduce_typed<mmp_fp16>(permuted, probs, offsets, cursor, rows_by_token, out, num_tokens, hidden, stream);
    case MMP_BF16: return reduce_typed<mmp_bf16>(permuted, probs, offsets, cursor, rows_by_token, out, num_tokens, hidden, stream);
  }
  return mmpErrorInvalidValue;
}
