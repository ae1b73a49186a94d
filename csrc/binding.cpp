// Torch binding of the csrc kernels: checks, output allocation, stream, dtype mapping.
//
// Compiled by the host C++ compiler for both builds: -DUSE_MUSA selects torch_musa's stream and
// device guard. Kernels live in the .cu files (see include/mmp_kernels.h); this file is the only
// one that sees ATen. The Python front is megatron_musa_patch/ops/kernels.py.
#include <torch/extension.h>

#include <optional>
#include <vector>

#include "mmp_kernels.h"

#if defined(USE_MUSA)
#include "torch_musa/csrc/core/MUSAGuard.h"
#include "torch_musa/csrc/core/MUSAStream.h"
#define MMP_DEVICE_NAME "musa"
using MmpDeviceGuard = c10::musa::OptionalMUSAGuard;
static inline mmpStream_t mmp_current_stream() { return c10::musa::getCurrentMUSAStream().stream(); }
static inline bool mmp_on_device(const at::Tensor& t) { return t.device().is_privateuseone(); }
#else
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#define MMP_DEVICE_NAME "cuda"
using MmpDeviceGuard = c10::cuda::OptionalCUDAGuard;
static inline mmpStream_t mmp_current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }
static inline bool mmp_on_device(const at::Tensor& t) { return t.is_cuda(); }
#endif

namespace {

MmpDtype to_mmp(const at::Tensor& t, const char* op, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return MMP_F32;
    case at::kHalf: return MMP_F16;
    case at::kBFloat16: return MMP_BF16;
    default:
      TORCH_CHECK(false, "mmp ", op, ": ", name, " must be float32, float16 or bfloat16, got ",
                  t.scalar_type());
  }
  return MMP_F32;
}

void check_tensor(const at::Tensor& t, const char* op, const char* name, const at::Tensor& ref) {
  TORCH_CHECK(t.defined(), "mmp ", op, ": ", name, " is undefined");
  TORCH_CHECK(mmp_on_device(t), "mmp ", op, ": ", name, " must be a " MMP_DEVICE_NAME " tensor, got ",
              t.device());
  TORCH_CHECK(t.device() == ref.device(), "mmp ", op, ": ", name, " is on ", t.device(), " but the input is on ",
              ref.device());
  TORCH_CHECK(t.is_contiguous(), "mmp ", op, ": ", name, " must be contiguous (call .contiguous())");
}

void check_launch(mmpError_t err, const char* op) {
  TORCH_CHECK(err == mmpSuccess, "mmp ", op, ": kernel launch failed: ", mmpGetErrorString(err));
}

// Norm weight: same dtype as x, or fp32; shape [hidden].
void check_norm_weight(const at::Tensor& w, const at::Tensor& x, const char* op, const char* name) {
  check_tensor(w, op, name, x);
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(-1), "mmp ", op, ": ", name, " must have shape [",
              x.size(-1), "] (the last dim of x), got ", w.sizes());
  TORCH_CHECK(w.scalar_type() == x.scalar_type() || w.scalar_type() == at::kFloat, "mmp ", op, ": ", name,
              " must be ", x.scalar_type(), " (like x) or float32, got ", w.scalar_type());
}

void check_norm_input(const at::Tensor& x, const char* op) {
  check_tensor(x, op, "x", x);
  to_mmp(x, op, "x");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, "mmp ", op, ": x must have a non-empty last dimension, got ",
              x.sizes());
}

std::vector<int64_t> stat_shape(const at::Tensor& x) {
  auto s = x.sizes().vec();
  s.pop_back();
  return s;
}

void check_stat(const at::Tensor& s, const at::Tensor& x, const char* op, const char* name) {
  check_tensor(s, op, name, x);
  TORCH_CHECK(s.scalar_type() == at::kFloat, "mmp ", op, ": ", name, " must be float32 (as the forward returns it)");
  TORCH_CHECK(s.numel() * x.size(-1) == x.numel(), "mmp ", op, ": ", name, " must hold one value per row of x (",
              x.numel() / x.size(-1), "), got ", s.numel());
}

// ---- norms -------------------------------------------------------------------------------------

std::vector<at::Tensor> rms_norm_fwd(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const char* op = "rms_norm_fwd";
  check_norm_input(x, op);
  check_norm_weight(weight, x, op, "weight");
  MmpDeviceGuard guard(x.device());
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  auto y = at::empty_like(x);
  auto rstd = at::empty(stat_shape(x), x.options().dtype(at::kFloat));
  check_launch(mmp_rms_norm_fwd(x.data_ptr(), weight.data_ptr(), y.data_ptr(), rstd.data_ptr<float>(), rows, cols,
                                (float)eps, to_mmp(x, op, "x"), to_mmp(weight, op, "weight"), mmp_current_stream()),
               op);
  return {y, rstd};
}

std::vector<at::Tensor> rms_norm_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
                                     const at::Tensor& rstd) {
  const char* op = "rms_norm_bwd";
  check_norm_input(x, op);
  check_tensor(dy, op, "dy", x);
  TORCH_CHECK(dy.sizes() == x.sizes() && dy.scalar_type() == x.scalar_type(), "mmp ", op,
              ": dy must match x in shape and dtype, got ", dy.sizes(), " ", dy.scalar_type(), " vs ", x.sizes(), " ",
              x.scalar_type());
  check_norm_weight(weight, x, op, "weight");
  check_stat(rstd, x, op, "rstd");
  MmpDeviceGuard guard(x.device());
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  auto dx = at::empty_like(x);
  auto dw = at::zeros_like(weight);
  const MmpDtype xt = to_mmp(x, op, "x"), wt = to_mmp(weight, op, "weight");
  if (rows > 0) {
    const int64_t groups = mmp_norm_bwd_partial_rows(rows, cols, xt, wt, false);
    auto ws = at::empty({groups, cols}, x.options().dtype(at::kFloat));
    check_launch(mmp_rms_norm_bwd(dy.data_ptr(), x.data_ptr(), weight.data_ptr(), rstd.data_ptr<float>(),
                                  dx.data_ptr(), dw.data_ptr(), ws.data_ptr<float>(), rows, cols, xt, wt,
                                  mmp_current_stream()),
                 op);
  }
  return {dx, dw};
}

std::vector<at::Tensor> layer_norm_fwd(const at::Tensor& x, const at::Tensor& weight,
                                       const std::optional<at::Tensor>& bias, double eps) {
  const char* op = "layer_norm_fwd";
  check_norm_input(x, op);
  check_norm_weight(weight, x, op, "weight");
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias) {
    check_norm_weight(*bias, x, op, "bias");
    TORCH_CHECK(bias->scalar_type() == weight.scalar_type(), "mmp ", op, ": bias dtype ", bias->scalar_type(),
                " must match weight dtype ", weight.scalar_type());
  }
  MmpDeviceGuard guard(x.device());
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  auto y = at::empty_like(x);
  auto mean = at::empty(stat_shape(x), x.options().dtype(at::kFloat));
  auto rstd = at::empty(stat_shape(x), x.options().dtype(at::kFloat));
  check_launch(mmp_layer_norm_fwd(x.data_ptr(), weight.data_ptr(), has_bias ? bias->data_ptr() : nullptr,
                                  y.data_ptr(), mean.data_ptr<float>(), rstd.data_ptr<float>(), rows, cols,
                                  (float)eps, to_mmp(x, op, "x"), to_mmp(weight, op, "weight"),
                                  mmp_current_stream()),
               op);
  return {y, mean, rstd};
}

std::vector<at::Tensor> layer_norm_bwd(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& weight,
                                       const at::Tensor& mean, const at::Tensor& rstd) {
  const char* op = "layer_norm_bwd";
  check_norm_input(x, op);
  check_tensor(dy, op, "dy", x);
  TORCH_CHECK(dy.sizes() == x.sizes() && dy.scalar_type() == x.scalar_type(), "mmp ", op,
              ": dy must match x in shape and dtype, got ", dy.sizes(), " ", dy.scalar_type(), " vs ", x.sizes(), " ",
              x.scalar_type());
  check_norm_weight(weight, x, op, "weight");
  check_stat(mean, x, op, "mean");
  check_stat(rstd, x, op, "rstd");
  MmpDeviceGuard guard(x.device());
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  auto dx = at::empty_like(x);
  auto dw = at::zeros_like(weight);
  auto db = at::zeros_like(weight);
  const MmpDtype xt = to_mmp(x, op, "x"), wt = to_mmp(weight, op, "weight");
  if (rows > 0) {
    const int64_t groups = mmp_norm_bwd_partial_rows(rows, cols, xt, wt, true);
    auto ws = at::empty({2, groups, cols}, x.options().dtype(at::kFloat));
    check_launch(mmp_layer_norm_bwd(dy.data_ptr(), x.data_ptr(), weight.data_ptr(), mean.data_ptr<float>(),
                                    rstd.data_ptr<float>(), dx.data_ptr(), dw.data_ptr(), db.data_ptr(),
                                    ws.data_ptr<float>(), rows, cols, xt, wt, mmp_current_stream()),
                 op);
  }
  return {dx, dw, db};
}

// ---- SwiGLU --------------------------------------------------------------------------------------

at::Tensor swiglu_fwd(const at::Tensor& x) {
  const char* op = "swiglu_fwd";
  check_tensor(x, op, "x", x);
  const MmpDtype t = to_mmp(x, op, "x");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, "mmp ", op, ": the last dim of x must be even (2 * ffn), got ",
              x.sizes());
  MmpDeviceGuard guard(x.device());
  const int64_t f = x.size(-1) / 2;
  auto shape = x.sizes().vec();
  shape.back() = f;
  auto y = at::empty(shape, x.options());
  const int64_t rows = f > 0 ? x.numel() / (2 * f) : 0;
  check_launch(mmp_swiglu_fwd(x.data_ptr(), y.data_ptr(), rows, f, t, mmp_current_stream()), op);
  return y;
}

at::Tensor swiglu_bwd(const at::Tensor& dy, const at::Tensor& x) {
  const char* op = "swiglu_bwd";
  check_tensor(x, op, "x", x);
  check_tensor(dy, op, "dy", x);
  const MmpDtype t = to_mmp(x, op, "x");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, "mmp ", op, ": the last dim of x must be even (2 * ffn), got ",
              x.sizes());
  auto expect = x.sizes().vec();
  expect.back() = x.size(-1) / 2;
  TORCH_CHECK(dy.sizes().vec() == expect && dy.scalar_type() == x.scalar_type(), "mmp ", op, ": dy must have shape ",
              at::IntArrayRef(expect), " and dtype ", x.scalar_type(), ", got ", dy.sizes(), " ", dy.scalar_type());
  MmpDeviceGuard guard(x.device());
  const int64_t f = x.size(-1) / 2;
  auto dx = at::empty_like(x);
  const int64_t rows = f > 0 ? x.numel() / (2 * f) : 0;
  check_launch(mmp_swiglu_bwd(dy.data_ptr(), x.data_ptr(), dx.data_ptr(), rows, f, t, mmp_current_stream()), op);
  return dx;
}

// ---- RoPE ----------------------------------------------------------------------------------------

// freqs_or_cos: the angles [.., rot] (sin absent) or the cos table (sin = the sin table, same shape).
at::Tensor rope(const at::Tensor& t, const at::Tensor& freqs_or_cos, const std::optional<at::Tensor>& sin,
                bool interleaved, bool backward) {
  const char* op = backward ? "rope_bwd" : "rope_fwd";
  const char* tname = backward ? "dout" : "t";
  const bool tables = sin.has_value() && sin->defined();
  const char* fname = tables ? "cos" : "freqs";
  check_tensor(t, op, tname, t);
  const MmpDtype dt = to_mmp(t, op, tname);
  TORCH_CHECK(t.dim() == 4, "mmp ", op, ": ", tname, " must be 4-D [s, b, h, d] (megatron's bshd path), got ",
              t.sizes());
  const at::Tensor& freqs = freqs_or_cos;
  TORCH_CHECK(mmp_on_device(freqs) && freqs.device() == t.device(), "mmp ", op, ": ", fname, " must be on ",
              t.device(), ", got ", freqs.device());
  TORCH_CHECK(freqs.dim() == 4, "mmp ", op, ": ", fname, " must be 4-D [s, 1 or b, 1 or h, rot_dim], got ",
              freqs.sizes());
  if (tables)
    TORCH_CHECK(sin->sizes() == freqs.sizes() && sin->device() == t.device(), "mmp ", op,
                ": sin must have the shape of cos ", freqs.sizes(), " on ", t.device(), ", got ", sin->sizes());
  const int64_t head_dim = t.size(3), rot_dim = freqs.size(3);
  TORCH_CHECK(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= head_dim, "mmp ", op, ": rot_dim = ", fname,
              ".shape[-1] must be even and in (0, ", head_dim, "], got ", rot_dim);
  for (int d = 0; d < 3; ++d)
    TORCH_CHECK(freqs.size(d) == 1 || freqs.size(d) == t.size(d), "mmp ", op, ": ", fname, " ", freqs.sizes(),
                " does not broadcast over ", tname, " ", t.sizes(), " in dim ", d);
  MmpDeviceGuard guard(t.device());
  // fp32 angles / tables (an exact widening for bf16/fp16 tables); broadcast dims get stride 0
  const std::vector<int64_t> full{t.size(0), t.size(1), t.size(2), rot_dim};
  auto f = freqs.to(at::kFloat).contiguous().expand(full);
  at::Tensor s_table;
  if (tables) s_table = sin->to(at::kFloat).contiguous().expand(full);
  auto out = at::empty_like(t);
  check_launch(mmp_rope(t.data_ptr(), f.data_ptr<float>(), tables ? s_table.data_ptr<float>() : nullptr,
                        out.data_ptr(), t.size(0), t.size(1), t.size(2), head_dim, rot_dim, f.stride(0),
                        f.stride(1), f.stride(2), interleaved, backward, dt, mmp_current_stream()),
               op);
  return out;
}

at::Tensor rope_fwd(const at::Tensor& t, const at::Tensor& freqs, bool interleaved) {
  return rope(t, freqs, std::nullopt, interleaved, false);
}

at::Tensor rope_bwd(const at::Tensor& dout, const at::Tensor& freqs, bool interleaved) {
  return rope(dout, freqs, std::nullopt, interleaved, true);
}

at::Tensor rope_fwd_cos_sin(const at::Tensor& t, const at::Tensor& cos, const at::Tensor& sin, bool interleaved) {
  return rope(t, cos, sin, interleaved, false);
}

at::Tensor rope_bwd_cos_sin(const at::Tensor& dout, const at::Tensor& cos, const at::Tensor& sin, bool interleaved) {
  return rope(dout, cos, sin, interleaved, true);
}

// ---- MoE permute / unpermute -----------------------------------------------------------------------

std::vector<at::Tensor> permute(const at::Tensor& tokens, const at::Tensor& routing_map,
                                const std::optional<at::Tensor>& probs, std::optional<int64_t> num_out_tokens) {
  const char* op = "permute";
  check_tensor(tokens, op, "tokens", tokens);
  const MmpDtype dt = to_mmp(tokens, op, "tokens");
  TORCH_CHECK(tokens.dim() == 2, "mmp ", op, ": tokens must be [num_tokens, hidden], got ", tokens.sizes());
  TORCH_CHECK(mmp_on_device(routing_map) && routing_map.device() == tokens.device(), "mmp ", op,
              ": routing_map must be on ", tokens.device());
  TORCH_CHECK(routing_map.dim() == 2 && routing_map.size(0) == tokens.size(0), "mmp ", op,
              ": routing_map must be [num_tokens=", tokens.size(0), ", num_experts], got ", routing_map.sizes());
  const bool has_probs = probs.has_value() && probs->defined();
  if (has_probs)
    TORCH_CHECK(probs->sizes() == routing_map.sizes() && probs->device() == tokens.device(), "mmp ", op,
                ": probs must be [num_tokens, num_experts] like routing_map on ", tokens.device(), ", got ",
                probs->sizes());
  MmpDeviceGuard guard(tokens.device());
  const int64_t num_tokens = tokens.size(0), hidden = tokens.size(1), num_experts = routing_map.size(1);
  // expert-major 0/1 map and its running count = each selected entry's output position + 1
  auto map_t = routing_map.ne(0).t().contiguous().to(at::kByte);
  auto positions = at::cumsum(map_t.view({-1}), 0, at::kInt);
  int64_t num_out;
  if (num_out_tokens.has_value() && *num_out_tokens >= 0) {
    num_out = *num_out_tokens;  // caller's promise: == routing_map.sum() (avoids a host sync)
  } else {
    num_out = positions.numel() > 0 ? positions[-1].item<int64_t>() : 0;
  }
  auto sorted = at::zeros({num_out}, tokens.options().dtype(at::kLong));
  at::Tensor probs_f, permuted_probs;
  if (has_probs) {
    probs_f = probs->to(at::kFloat).contiguous();
    permuted_probs = at::zeros({num_out}, tokens.options().dtype(at::kFloat));
  }
  auto out = at::empty({num_out, hidden}, tokens.options());
  const auto stream = mmp_current_stream();
  check_launch(mmp_permute_index(map_t.data_ptr<uint8_t>(), positions.data_ptr<int32_t>(), num_tokens, num_experts,
                                 num_out, has_probs ? probs_f.data_ptr<float>() : nullptr, sorted.data_ptr<int64_t>(),
                                 has_probs ? permuted_probs.data_ptr<float>() : nullptr, stream),
               op);
  check_launch(mmp_gather_rows(tokens.data_ptr(), sorted.data_ptr<int64_t>(), out.data_ptr(), num_out, num_tokens,
                               hidden, dt, stream),
               op);
  if (has_probs) permuted_probs = permuted_probs.to(probs->scalar_type());
  return {out, permuted_probs, sorted};
}

// out[p] = tokens[index[p]] (index int64 [P], values in [0, num_tokens)).
at::Tensor gather_rows(const at::Tensor& tokens, const at::Tensor& index) {
  const char* op = "permute";
  check_tensor(tokens, op, "tokens", tokens);
  const MmpDtype dt = to_mmp(tokens, op, "tokens");
  TORCH_CHECK(tokens.dim() == 2, "mmp ", op, ": tokens must be [num_tokens, hidden], got ", tokens.sizes());
  check_tensor(index, op, "token_indices", tokens);
  TORCH_CHECK(index.scalar_type() == at::kLong && index.dim() == 1, "mmp ", op,
              ": token_indices must be 1-D int64, got ", index.scalar_type(), " ", index.sizes());
  MmpDeviceGuard guard(tokens.device());
  auto out = at::empty({index.size(0), tokens.size(1)}, tokens.options());
  check_launch(mmp_gather_rows(tokens.data_ptr(), index.data_ptr<int64_t>(), out.data_ptr(), index.size(0),
                               tokens.size(0), tokens.size(1), dt, mmp_current_stream()),
               op);
  return out;
}

at::Tensor unpermute(const at::Tensor& permuted, const at::Tensor& sorted_indices, std::vector<int64_t> restore_shape,
                     const std::optional<at::Tensor>& probs) {
  const char* op = "unpermute";
  check_tensor(permuted, op, "permuted", permuted);
  const MmpDtype dt = to_mmp(permuted, op, "permuted");
  TORCH_CHECK(permuted.dim() == 2, "mmp ", op, ": permuted must be [num_permuted, hidden], got ", permuted.sizes());
  check_tensor(sorted_indices, op, "sorted_indices", permuted);
  TORCH_CHECK(sorted_indices.scalar_type() == at::kLong && sorted_indices.dim() == 1 &&
                  sorted_indices.size(0) == permuted.size(0),
              "mmp ", op, ": sorted_indices must be int64 [", permuted.size(0), "], got ", sorted_indices.scalar_type(),
              " ", sorted_indices.sizes());
  TORCH_CHECK(restore_shape.size() == 2 && restore_shape[1] == permuted.size(1), "mmp ", op,
              ": restore_shape must be (num_tokens, hidden=", permuted.size(1), "), got ",
              at::IntArrayRef(restore_shape));
  const bool has_probs = probs.has_value() && probs->defined();
  at::Tensor probs_f;
  if (has_probs) {
    TORCH_CHECK(probs->dim() == 1 && probs->size(0) == permuted.size(0) && probs->device() == permuted.device(),
                "mmp ", op, ": probs must be the permuted probs [", permuted.size(0), "] on ", permuted.device(),
                ", got ", probs->sizes(), " (2-D probs go through kernels.get('unpermute') with routing_map)");
    probs_f = probs->to(at::kFloat).contiguous();
  }
  MmpDeviceGuard guard(permuted.device());
  const int64_t num_tokens = restore_shape[0], hidden = restore_shape[1], num_permuted = permuted.size(0);
  auto out = at::empty({num_tokens, hidden}, permuted.options());
  auto iopt = permuted.options().dtype(at::kInt);
  auto counts = at::zeros({num_tokens}, iopt);
  const auto stream = mmp_current_stream();
  check_launch(mmp_unpermute_count(sorted_indices.data_ptr<int64_t>(), num_permuted, num_tokens,
                                   counts.data_ptr<int32_t>(), stream),
               op);
  auto offsets = (at::cumsum(counts, 0, at::kInt) - counts).contiguous();
  auto cursor = at::zeros({num_tokens}, iopt);
  auto rows_by_token = at::empty({num_permuted > 0 ? num_permuted : 1}, iopt);
  check_launch(mmp_unpermute_reduce(permuted.data_ptr(), sorted_indices.data_ptr<int64_t>(),
                                    has_probs ? probs_f.data_ptr<float>() : nullptr, offsets.data_ptr<int32_t>(),
                                    cursor.data_ptr<int32_t>(), rows_by_token.data_ptr<int32_t>(), out.data_ptr(),
                                    num_permuted, num_tokens, hidden, dt, stream),
               op);
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "megatron_musa_patch fused kernels (csrc/); use megatron_musa_patch.ops.kernels";
  m.attr("device_type") = MMP_DEVICE_NAME;
  m.attr("ops") = std::vector<std::string>{"rms_norm_fwd", "rms_norm_bwd", "layer_norm_fwd", "layer_norm_bwd",
                                           "swiglu_fwd",   "swiglu_bwd",   "rope_fwd",       "rope_bwd",
                                           "permute",      "unpermute"};
  m.def("rms_norm_fwd", &rms_norm_fwd, "(x, weight, eps) -> [y, rstd]", py::arg("x"), py::arg("weight"),
        py::arg("eps"));
  m.def("rms_norm_bwd", &rms_norm_bwd, "(dy, x, weight, rstd) -> [dx, dweight]", py::arg("dy"), py::arg("x"),
        py::arg("weight"), py::arg("rstd"));
  m.def("layer_norm_fwd", &layer_norm_fwd, "(x, weight, bias|None, eps) -> [y, mean, rstd]", py::arg("x"),
        py::arg("weight"), py::arg("bias"), py::arg("eps"));
  m.def("layer_norm_bwd", &layer_norm_bwd, "(dy, x, weight, mean, rstd) -> [dx, dweight, dbias]", py::arg("dy"),
        py::arg("x"), py::arg("weight"), py::arg("mean"), py::arg("rstd"));
  m.def("swiglu_fwd", &swiglu_fwd, "(x[..., 2f]) -> silu(x[..., :f]) * x[..., f:]", py::arg("x"));
  m.def("swiglu_bwd", &swiglu_bwd, "(dy[..., f], x[..., 2f]) -> dx", py::arg("dy"), py::arg("x"));
  m.def("rope_fwd", &rope_fwd, "(t[s,b,h,d], freqs[s,1,1,rot], interleaved) -> out", py::arg("t"), py::arg("freqs"),
        py::arg("interleaved"));
  m.def("rope_bwd", &rope_bwd, "(dout, freqs, interleaved) -> dt", py::arg("dout"), py::arg("freqs"),
        py::arg("interleaved"));
  m.def("rope_fwd_cos_sin", &rope_fwd_cos_sin, "(t, cos, sin, interleaved) -> out", py::arg("t"), py::arg("cos"),
        py::arg("sin"), py::arg("interleaved"));
  m.def("rope_bwd_cos_sin", &rope_bwd_cos_sin, "(dout, cos, sin, interleaved) -> dt", py::arg("dout"),
        py::arg("cos"), py::arg("sin"), py::arg("interleaved"));
  m.def("gather_rows", &gather_rows, "(tokens[N, H], index int64[P]) -> tokens[index]", py::arg("tokens"),
        py::arg("index"));
  m.def("permute", &permute, "(tokens, routing_map, probs|None, num_out_tokens|None) -> [out, probs|None, indices]",
        py::arg("tokens"), py::arg("routing_map"), py::arg("probs") = py::none(),
        py::arg("num_out_tokens") = py::none());
  m.def("unpermute", &unpermute, "(permuted, sorted_indices, restore_shape, permuted_probs|None) -> out",
        py::arg("permuted"), py::arg("sorted_indices"), py::arg("restore_shape"), py::arg("probs") = py::none());
}
