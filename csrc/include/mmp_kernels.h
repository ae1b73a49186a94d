// Host launchers of the kernels in csrc/*.cu. The torch binding (csrc/binding.cpp) checks the
// tensors, allocates outputs and calls these with raw pointers on the current stream.
//
// Every launcher only enqueues work; it returns the launch error (mmpSuccess when fine).
// Layouts: row-major, contiguous, last dimension = `cols` (hidden). Statistics are fp32.
#pragma once

#include "mmp_device.h"

// ---- RMSNorm: y = x * rstd * w,  rstd = 1 / sqrt(mean(x^2) + eps) -----------------------------
mmpError_t mmp_rms_norm_fwd(const void* x, const void* w, void* y, float* rstd, int64_t rows,
                            int64_t cols, float eps, MmpDtype xt, MmpDtype wt, mmpStream_t stream);

// Rows of the fp32 workspace [partial_rows, cols] (RMSNorm) or [2, partial_rows, cols]
// (LayerNorm) the backward launchers need for the weight/bias gradient.
int64_t mmp_norm_bwd_partial_rows(int64_t rows, int64_t cols, MmpDtype xt, MmpDtype wt, bool layer_norm);

mmpError_t mmp_rms_norm_bwd(const void* dy, const void* x, const void* w, const float* rstd, void* dx,
                            void* dw, float* workspace, int64_t rows, int64_t cols, MmpDtype xt,
                            MmpDtype wt, mmpStream_t stream);

// ---- LayerNorm: y = (x - mean) * rstd * w + b (b may be null) ---------------------------------
mmpError_t mmp_layer_norm_fwd(const void* x, const void* w, const void* b, void* y, float* mean,
                              float* rstd, int64_t rows, int64_t cols, float eps, MmpDtype xt,
                              MmpDtype wt, mmpStream_t stream);

mmpError_t mmp_layer_norm_bwd(const void* dy, const void* x, const void* w, const float* mean,
                              const float* rstd, void* dx, void* dw, void* db, float* workspace,
                              int64_t rows, int64_t cols, MmpDtype xt, MmpDtype wt, mmpStream_t stream);

// ---- SwiGLU: x = [rows, 2f] -> y = silu(x[:, :f]) * x[:, f:]  (megatron's gated half first) --
mmpError_t mmp_swiglu_fwd(const void* x, void* y, int64_t rows, int64_t f, MmpDtype t, mmpStream_t stream);
mmpError_t mmp_swiglu_bwd(const void* dy, const void* x, void* dx, int64_t rows, int64_t f, MmpDtype t,
                          mmpStream_t stream);

// ---- RoPE on t = [d0, d1, d2, head_dim] (contiguous), rotating the first rot_dim channels -----
// freqs is fp32, indexed freqs[i0 * fs0 + i1 * fs1 + i2 * fs2 + c] (stride 0 = broadcast): the
// angles when sin_table is null, else the cos table, with sin_table laid out the same way.
// backward == true applies the transposed rotation (the gradient of the forward).
mmpError_t mmp_rope(const void* in, const float* freqs, const float* sin_table, void* out, int64_t d0, int64_t d1, int64_t d2,
                    int64_t head_dim, int64_t rot_dim, int64_t fs0, int64_t fs1, int64_t fs2,
                    bool interleaved, bool backward, MmpDtype t, mmpStream_t stream);

// ---- MoE permute / unpermute ------------------------------------------------------------------
// routing_map_t: [num_experts, num_tokens] bytes (0/1), positions: its inclusive prefix sum
// (int32, same shape). Writes sorted_indices[pos-1] = token for every set entry (expert-major,
// tokens ascending) and, when probs ([num_tokens, num_experts] fp32) is given, permuted_probs.
mmpError_t mmp_permute_index(const uint8_t* routing_map_t, const int32_t* positions, int64_t num_tokens,
                             int64_t num_experts, int64_t num_out, const float* probs,
                             int64_t* sorted_indices, float* permuted_probs, mmpStream_t stream);
// out[p, :] = tokens[sorted_indices[p], :]
mmpError_t mmp_gather_rows(const void* tokens, const int64_t* sorted_indices, void* out, int64_t num_out,
                           int64_t num_tokens, int64_t hidden, MmpDtype t, mmpStream_t stream);

// Unpermute in three steps, deterministic (no floating-point atomics):
//   1. mmp_unpermute_count: counts[token] += 1 for every permuted row
//   2. (binding) offsets = exclusive prefix sum of counts
//   3. mmp_unpermute_reduce: out[token, :] = sum over its rows p (ascending p) of
//      permuted[p, :] * probs[p] (probs may be null = 1), summed in fp32.
// rows_by_token and cursor are int32 workspaces of num_permuted and num_tokens entries
// (cursor zeroed). Indices outside [0, num_tokens) are ignored.
mmpError_t mmp_unpermute_count(const int64_t* sorted_indices, int64_t num_permuted, int64_t num_tokens,
                               int32_t* counts, mmpStream_t stream);
mmpError_t mmp_unpermute_reduce(const void* permuted, const int64_t* sorted_indices, const float* probs,
                                const int32_t* offsets, int32_t* cursor, int32_t* rows_by_token,
                                void* out, int64_t num_permuted, int64_t num_tokens, int64_t hidden,
                                MmpDtype t, mmpStream_t stream);
