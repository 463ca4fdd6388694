// Thin torch binding: checks tensors, then calls the launchers on the current CUDA stream. Every op writes
// into caller-allocated outputs so that it can be captured in a CUDA graph.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <numeric>

#include "launch.cuh"
#include "launchers.h"

namespace {

void check_cuda(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
}

void check(const at::Tensor& t, const char* name, at::ScalarType dtype) {
  check_cuda(t, name);
  TORCH_CHECK(t.scalar_type() == dtype, name, " has dtype ", t.scalar_type(), ", expected ", dtype);
}

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 2 && t.stride(1) == 1, name, " must be 2-D with unit inner stride");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(0) % 8 == 0, name,
              " rows must be 16-byte aligned");
}

void ok(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, " failed: ", cudaGetErrorString(err));
}

cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream(); }

// The checks shared by the RMSNorm ops: bf16 rows x, a [hidden] weight and an optional residual laid out as x.
// Returns the residual's pointer (null without one).
void* check_norm_inputs(at::Tensor x, c10::optional<at::Tensor> residual, at::Tensor weight) {
  check(x, "x", at::kBFloat16);
  check(weight, "weight", at::kBFloat16);
  check_rows(x, "x");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == x.size(1), "weight must be [hidden]");
  if (!residual.has_value()) return nullptr;
  check(*residual, "residual", at::kBFloat16);
  TORCH_CHECK(residual->sizes() == x.sizes() && residual->strides() == x.strides(), "residual must match x");
  return residual->data_ptr();
}

// The checks of a quantized-rows output for rows shaped as `like`: contiguous e4m3 codes and an fp32 scale a row.
void check_quantized_rows(at::Tensor codes, at::Tensor scale, const at::Tensor& like, const char* like_name) {
  check(codes, "codes", at::kFloat8_e4m3fn);
  check(scale, "scale", at::kFloat);
  TORCH_CHECK(codes.is_contiguous() && codes.sizes() == like.sizes(), "codes must be contiguous and ", like_name,
              "'s shape");
  TORCH_CHECK(scale.is_contiguous() && scale.numel() == like.size(0), "scale must be [rows]");
}

void rms_norm(at::Tensor out, at::Tensor x, c10::optional<at::Tensor> residual, at::Tensor weight, double eps) {
  void* res = check_norm_inputs(x, residual, weight);
  check(out, "out", at::kBFloat16);
  check_rows(out, "out");
  const c10::cuda::CUDAGuard guard(x.device());
  ok(q3tts::rms_norm(out.data_ptr(), x.data_ptr(), res, weight.data_ptr(), x.size(0), x.size(1), x.stride(0),
                     out.stride(0), static_cast<float>(eps), stream()),
     "rms_norm");
}

// `scale` given: `out` is the norm's e4m3 codes (rms_norm_fp8's), scale its rows' scales.
void rms_norm_split_sums(at::Tensor out, c10::optional<at::Tensor> scale, at::Tensor partials, at::Tensor residual,
                         at::Tensor weight, double eps) {
  check(partials, "partials", at::kFloat);
  check(residual, "residual", at::kBFloat16);
  check(weight, "weight", at::kBFloat16);
  check_rows(residual, "residual");
  if (scale.has_value()) {
    check_quantized_rows(out, *scale, residual, "residual");
  } else {
    check(out, "out", at::kBFloat16);
    check_rows(out, "out");
  }
  const int64_t hidden = residual.size(1);
  TORCH_CHECK(partials.dim() == 3 && partials.is_contiguous() && partials.size(1) >= residual.size(0) &&
                  partials.size(2) == hidden,
              "partials must be contiguous [splits, >= rows, hidden]");
  TORCH_CHECK(out.sizes() == residual.sizes(), "out must be residual's shape");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == hidden, "weight must be [hidden]");
  const c10::cuda::CUDAGuard guard(residual.device());
  float* scales = scale.has_value() ? scale->data_ptr<float>() : nullptr;
  ok(q3tts::rms_norm_split_sums(out.data_ptr(), scales, partials.data_ptr<float>(), partials.size(0),
                                partials.stride(0), residual.data_ptr(), weight.data_ptr(), residual.size(0), hidden,
                                residual.stride(0), out.stride(0), static_cast<float>(eps), stream()),
     "rms_norm_split_sums");
}

void rms_norm_fp8(at::Tensor codes, at::Tensor scale, at::Tensor x, c10::optional<at::Tensor> residual,
                  at::Tensor weight, double eps) {
  void* res = check_norm_inputs(x, residual, weight);
  check_quantized_rows(codes, scale, x, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  ok(q3tts::rms_norm_fp8(codes.data_ptr(), scale.data_ptr<float>(), x.data_ptr(), res, weight.data_ptr(), x.size(0),
                         x.size(1), x.stride(0), static_cast<float>(eps), stream()),
     "rms_norm_fp8");
}

// The rows' scales of one layer's K/V caches: null for bf16 caches; for e4m3 caches (kv_cache.cuh) the
// contiguous float32 [slots, kv_heads, max_len] tensors `scales` must hold.
struct CacheScalePointers {
  float* k;
  float* v;
};

CacheScalePointers check_caches(const at::Tensor& k_cache, const at::Tensor& v_cache,
                                const c10::optional<at::Tensor>& k_scale, const c10::optional<at::Tensor>& v_scale) {
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes(),
              "caches must be contiguous [slots, kv_heads, max_len, head_dim]");
  TORCH_CHECK(k_scale.has_value() == v_scale.has_value(), "give both cache scales or neither");
  if (!k_scale.has_value()) {
    check(k_cache, "k_cache", at::kBFloat16);
    check(v_cache, "v_cache", at::kBFloat16);
    return {nullptr, nullptr};
  }
  check(k_cache, "k_cache", at::kFloat8_e4m3fn);
  check(v_cache, "v_cache", at::kFloat8_e4m3fn);
  for (const auto* s : {&*k_scale, &*v_scale}) {
    check(*s, "cache scales", at::kFloat);
    TORCH_CHECK(s->is_contiguous() && s->sizes() == k_cache.sizes().slice(0, 3),
                "cache scales must be contiguous [slots, kv_heads, max_len]");
  }
  return {k_scale->data_ptr<float>(), v_scale->data_ptr<float>()};
}

// The checks shared by the ops that norm and rope one new token per row and write its K/V to the cache;
// returns the caches' scale pointers (check_caches).
CacheScalePointers check_rope_inputs(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor q_norm, at::Tensor k_norm,
                                     at::Tensor cos, at::Tensor sin, at::Tensor positions, at::Tensor slots,
                                     at::Tensor k_cache, at::Tensor v_cache, const c10::optional<at::Tensor>& k_scale,
                                     const c10::optional<at::Tensor>& v_scale) {
  for (auto* t : {&q, &k, &v, &q_norm, &k_norm, &cos, &sin}) {
    check(*t, "tensor", at::kBFloat16);
  }
  check(positions, "positions", at::kLong);
  check(slots, "slots", at::kLong);
  const CacheScalePointers scales = check_caches(k_cache, v_cache, k_scale, v_scale);
  const int64_t batch = q.size(0), head_dim = k_cache.size(3), kv_heads = k_cache.size(1);
  TORCH_CHECK(q.dim() == 2 && k.dim() == 2 && v.dim() == 2, "q, k, v must be [batch, heads * head_dim]");
  TORCH_CHECK(q.stride(1) == 1 && k.stride(1) == 1 && v.stride(1) == 1, "q, k, v need unit inner stride");
  TORCH_CHECK(k.size(1) == kv_heads * head_dim && v.size(1) == kv_heads * head_dim, "k/v width mismatch");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.size(-1) == head_dim, "cos/sin tables");
  TORCH_CHECK(positions.numel() == batch && slots.numel() == batch, "positions/slots must be [batch]");
  return scales;
}

void qk_norm_rope_cache(at::Tensor q_out, c10::optional<at::Tensor> k_out, at::Tensor q, at::Tensor k,
                        at::Tensor v, at::Tensor q_norm, at::Tensor k_norm, at::Tensor cos, at::Tensor sin,
                        at::Tensor positions, at::Tensor slots, at::Tensor k_cache, at::Tensor v_cache, double eps,
                        c10::optional<at::Tensor> k_scale, c10::optional<at::Tensor> v_scale) {
  const CacheScalePointers scales =
      check_rope_inputs(q, k, v, q_norm, k_norm, cos, sin, positions, slots, k_cache, v_cache, k_scale, v_scale);
  check(q_out, "q_out", at::kBFloat16);
  TORCH_CHECK(q_out.is_contiguous() && q_out.numel() == q.numel(), "q_out must be contiguous like q");
  void* keys = nullptr;
  if (k_out.has_value()) {
    check(*k_out, "k_out", at::kBFloat16);
    TORCH_CHECK(k_out->is_contiguous() && k_out->numel() == k.numel(), "k_out must be contiguous like k");
    keys = k_out->data_ptr();
  }
  const int64_t batch = q.size(0), head_dim = k_cache.size(3), kv_heads = k_cache.size(1);
  const c10::cuda::CUDAGuard guard(q.device());
  ok(q3tts::qk_norm_rope_cache(q_out.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), q.stride(0),
                               k.stride(0), v.stride(0), q_norm.data_ptr(), k_norm.data_ptr(), cos.data_ptr(),
                               sin.data_ptr(), positions.data_ptr<int64_t>(), slots.data_ptr<int64_t>(),
                               k_cache.data_ptr(), v_cache.data_ptr(), scales.k, scales.v, keys, batch,
                               q.size(1) / head_dim,
                               kv_heads, head_dim, k_cache.size(2), static_cast<float>(eps), stream()),
     "qk_norm_rope_cache");
}

int64_t decode_attention_workspace(int64_t batch, int64_t q_heads, int64_t head_dim, int64_t max_len) {
  return batch * q_heads * q3tts::decode_attention_splits(max_len, 64) * (head_dim + 2);
}

void rope_attention(at::Tensor out, c10::optional<at::Tensor> workspace, at::Tensor q, at::Tensor k, at::Tensor v,
                    at::Tensor q_norm, at::Tensor k_norm, at::Tensor cos, at::Tensor sin, at::Tensor positions,
                    at::Tensor slots, at::Tensor k_cache, at::Tensor v_cache, double eps, double scale,
                    c10::optional<at::Tensor> k_scale, c10::optional<at::Tensor> v_scale) {
  const CacheScalePointers scales =
      check_rope_inputs(q, k, v, q_norm, k_norm, cos, sin, positions, slots, k_cache, v_cache, k_scale, v_scale);
  check(out, "out", at::kBFloat16);
  TORCH_CHECK(out.is_contiguous() && out.numel() == q.numel(), "out must be contiguous like q");
  const int64_t batch = q.size(0), head_dim = k_cache.size(3), kv_heads = k_cache.size(1);
  const int64_t q_heads = q.size(1) / head_dim;
  float* ws = nullptr;
  if (workspace.has_value()) {
    check(*workspace, "workspace", at::kFloat);
    TORCH_CHECK(workspace->numel() >= decode_attention_workspace(batch, q_heads, head_dim, k_cache.size(2)),
                "workspace too small");
    ws = workspace->data_ptr<float>();
  }
  TORCH_CHECK(ws != nullptr || k_cache.size(2) <= 64, "a cache of more than 64 positions needs a workspace");
  const c10::cuda::CUDAGuard guard(q.device());
  ok(q3tts::rope_attention(out.data_ptr(), ws, q.data_ptr(), k.data_ptr(), v.data_ptr(), q.stride(0), k.stride(0),
                           v.stride(0), q_norm.data_ptr(), k_norm.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                           positions.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), k_cache.data_ptr(),
                           v_cache.data_ptr(), scales.k, scales.v, batch, q_heads, kv_heads, head_dim, k_cache.size(2),
                           static_cast<float>(eps), static_cast<float>(scale), stream()),
     "rope_attention");
}

void decode_attention(at::Tensor out, at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor slots,
                      at::Tensor lengths, at::Tensor workspace, double scale, int64_t span,
                      c10::optional<at::Tensor> k_scale, c10::optional<at::Tensor> v_scale) {
  for (auto* t : {&out, &q}) check(*t, "tensor", at::kBFloat16);
  const CacheScalePointers scales = check_caches(k_cache, v_cache, k_scale, v_scale);
  check(slots, "slots", at::kLong);
  check(lengths, "lengths", at::kLong);
  check(workspace, "workspace", at::kFloat);
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous() && out.is_contiguous(), "q/out must be contiguous [B, heads, D]");
  const int64_t batch = q.size(0), q_heads = q.size(1), head_dim = q.size(2);
  TORCH_CHECK(span >= 1 && span <= k_cache.size(2), "span must be in 1..cache positions");
  TORCH_CHECK(workspace.numel() >= decode_attention_workspace(batch, q_heads, head_dim, span),
              "workspace too small");
  const c10::cuda::CUDAGuard guard(q.device());
  ok(q3tts::decode_attention(out.data_ptr(), q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), scales.k,
                             scales.v, slots.data_ptr<int64_t>(), lengths.data_ptr<int64_t>(), workspace.data_ptr<float>(),
                             batch, q_heads, k_cache.size(1), head_dim, k_cache.size(2), span, 64,
                             static_cast<float>(scale), stream()),
     "decode_attention");
}

void silu_mul(at::Tensor out, at::Tensor gate, at::Tensor up) {
  for (auto* t : {&out, &gate, &up}) check(*t, "tensor", at::kBFloat16);
  check_rows(gate, "gate");
  check_rows(up, "up");
  check_rows(out, "out");
  TORCH_CHECK(gate.sizes() == up.sizes() && out.sizes() == gate.sizes(), "shape mismatch");
  const c10::cuda::CUDAGuard guard(gate.device());
  ok(q3tts::silu_mul(out.data_ptr(), gate.data_ptr(), up.data_ptr(), gate.size(0), gate.size(1), gate.stride(0),
                     up.stride(0), out.stride(0), stream()),
     "silu_mul");
}

void silu_mul_fp8(at::Tensor codes, at::Tensor scale, at::Tensor gate, at::Tensor up) {
  check(gate, "gate", at::kBFloat16);
  check(up, "up", at::kBFloat16);
  check_rows(gate, "gate");
  check_rows(up, "up");
  TORCH_CHECK(gate.sizes() == up.sizes(), "gate and up must be one shape");
  check_quantized_rows(codes, scale, gate, "gate");
  const c10::cuda::CUDAGuard guard(gate.device());
  ok(q3tts::silu_mul_fp8(codes.data_ptr(), scale.data_ptr<float>(), gate.data_ptr(), up.data_ptr(), gate.size(0),
                         gate.size(1), gate.stride(0), up.stride(0), stream()),
     "silu_mul_fp8");
}

// out[r] = bf16(bf16(first_table[c[0]] + sum_j tables[j - 1][c[j]]) + text[r]), c = codes[code_rows[r]] (codes[r]
// without code_rows) (launchers.h).
void frame_embedding(at::Tensor out, at::Tensor codes, c10::optional<at::Tensor> code_rows, at::Tensor first_table,
                     at::Tensor tables, at::Tensor text) {
  for (auto* t : {&out, &first_table, &tables, &text}) check(*t, "tensor", at::kBFloat16);
  check(codes, "codes", at::kLong);
  check_rows(text, "text");
  TORCH_CHECK(codes.dim() == 2 && codes.stride(1) == 1, "codes must be [rows, groups] with unit column stride");
  TORCH_CHECK(first_table.dim() == 2 && first_table.is_contiguous(), "first_table must be contiguous [vocab, width]");
  TORCH_CHECK(tables.dim() == 3 && tables.is_contiguous() && tables.size(0) == codes.size(1) - 1 &&
                  tables.size(2) == first_table.size(1),
              "tables must be contiguous [groups - 1, vocab, width]");
  const int64_t rows = code_rows.has_value() ? code_rows->size(0) : codes.size(0);
  if (code_rows.has_value()) {
    check(*code_rows, "code_rows", at::kLong);
    TORCH_CHECK(code_rows->dim() == 1 && code_rows->is_contiguous(), "code_rows must be contiguous [rows]");
  }
  TORCH_CHECK(text.size(0) == rows && text.size(1) == first_table.size(1), "text must be [rows, width]");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == text.sizes(), "out must be contiguous [rows, width]");
  const c10::cuda::CUDAGuard guard(out.device());
  ok(q3tts::frame_embedding(out.data_ptr(), codes.data_ptr<int64_t>(), codes.stride(0),
                            code_rows.has_value() ? code_rows->data_ptr<int64_t>() : nullptr, first_table.data_ptr(),
                            first_table.size(0), tables.data_ptr(), tables.size(1), text.data_ptr(), text.stride(0),
                            rows, codes.size(1), first_table.size(1), stream()),
     "frame_embedding");
}

void quantize_rows_fp8(at::Tensor codes, at::Tensor scale, at::Tensor x) {
  check(x, "x", at::kBFloat16);
  check_rows(x, "x");
  check_quantized_rows(codes, scale, x, "x");
  const c10::cuda::CUDAGuard guard(x.device());
  ok(q3tts::quantize_rows_fp8(codes.data_ptr(), scale.data_ptr<float>(), x.data_ptr(), x.size(0), x.size(1),
                              x.stride(0), stream()),
     "quantize_rows_fp8");
}

// The GEMV weight's kind and its per-row scale (8-bit weights only), checked against x.
struct GemvWeight {
  q3tts::WeightKind kind;
  const float* scale;
};

// The kernels' name for a weight's dtype: bf16, int8 or float8_e4m3fn; nothing for another dtype.
c10::optional<q3tts::WeightKind> weight_kind(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16: return q3tts::WeightKind::kBf16;
    case at::kChar: return q3tts::WeightKind::kInt8;
    case at::kFloat8_e4m3fn: return q3tts::WeightKind::kFp8E4M3;
    default: return c10::nullopt;
  }
}

GemvWeight check_gemv_weight(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& scale) {
  check_cuda(w, "w");
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.size(1) == x.size(1), "w must be contiguous [out, in]");
  const c10::optional<q3tts::WeightKind> found = weight_kind(w.scalar_type());
  TORCH_CHECK(found.has_value(), "w must be bf16, int8 or float8_e4m3fn");
  const q3tts::WeightKind kind = *found;
  const float* s = nullptr;
  if (scale.has_value()) {
    check(*scale, "scale", at::kFloat);
    TORCH_CHECK(scale->is_contiguous() && scale->numel() == w.size(0), "scale must be [out]");
    s = scale->data_ptr<float>();
  }
  TORCH_CHECK(kind == q3tts::WeightKind::kBf16 || s != nullptr, "8-bit weights need a scale");
  return {kind, s};
}

// The output y of a GEMV of x with w: [n, outputs], unit inner stride; outputs = w's rows (half for SwiGLU).
int64_t check_gemv_output(const at::Tensor& y, const at::Tensor& x, const at::Tensor& w, bool swiglu) {
  check(y, "y", at::kBFloat16);
  TORCH_CHECK(y.dim() == 2 && y.stride(1) == 1, "y must be 2-D with unit inner stride");
  TORCH_CHECK(!swiglu || w.size(0) % 2 == 0, "a fused gate/up weight has an even number of rows");
  const int64_t outputs = swiglu ? w.size(0) / 2 : w.size(0);
  TORCH_CHECK(y.size(0) == x.size(0) && y.size(1) == outputs, "y must be [n, outputs]");
  return outputs;
}

// y = x @ w^T (+ bias), or with `swiglu` y = SiLU(x @ gate^T) * (x @ up^T) for w = [gate; up].
void gemv_impl(at::Tensor y, at::Tensor x, at::Tensor w, c10::optional<at::Tensor> scale, c10::optional<at::Tensor> bias,
               bool swiglu, int64_t l2_keep) {
  check(x, "x", at::kBFloat16);
  check_rows(x, "x");
  const GemvWeight weight = check_gemv_weight(x, w, scale);
  const int64_t outputs = check_gemv_output(y, x, w, swiglu);
  const void* b = nullptr;
  if (bias.has_value()) {
    check(*bias, "bias", at::kBFloat16);
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == w.size(0), "bias must be [out]");
    b = bias->data_ptr();
  }
  const c10::cuda::CUDAGuard guard(x.device());
  ok(q3tts::gemv(y.data_ptr(), x.data_ptr(), w.data_ptr(), weight.scale, b, x.size(0), x.size(1), outputs,
                 x.stride(0), y.stride(0), weight.kind, swiglu, l2_keep, stream()),
     "gemv");
}

// y = gemv(RMSNorm(x + delta) * norm_weight, w) (SwiGLU with `swiglu`), writing x + delta to sum_out when given.
void gemv_rms_norm(at::Tensor y, at::Tensor x, c10::optional<at::Tensor> delta, c10::optional<at::Tensor> sum_out,
                   at::Tensor norm_weight, double eps, at::Tensor w, c10::optional<at::Tensor> scale, bool swiglu,
                   int64_t l2_keep) {
  check(x, "x", at::kBFloat16);
  check_rows(x, "x");
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= 4, "gemv_rms_norm takes 1 to 4 rows");
  const GemvWeight weight = check_gemv_weight(x, w, scale);
  const int64_t outputs = check_gemv_output(y, x, w, swiglu);
  check(norm_weight, "norm_weight", at::kBFloat16);
  TORCH_CHECK(norm_weight.is_contiguous() && norm_weight.numel() == x.size(1), "norm_weight must be [in]");
  void* pointers[2] = {nullptr, nullptr};
  const c10::optional<at::Tensor>* given[2] = {&delta, &sum_out};
  for (int i = 0; i < 2; ++i) {
    if (!given[i]->has_value()) continue;
    const at::Tensor& t = given[i]->value();
    check(t, "delta and sum_out", at::kBFloat16);
    TORCH_CHECK(t.sizes() == x.sizes() && t.strides() == x.strides(), "delta and sum_out must be laid out like x");
    pointers[i] = t.data_ptr();
  }
  const c10::cuda::CUDAGuard guard(x.device());
  ok(q3tts::gemv_rms_norm(y.data_ptr(), x.data_ptr(), pointers[0], pointers[1], norm_weight.data_ptr(),
                          static_cast<float>(eps), w.data_ptr(), weight.scale, x.size(0), x.size(1), outputs,
                          x.stride(0), y.stride(0), weight.kind, swiglu, l2_keep, stream()),
     "gemv_rms_norm");
}

void gemv(at::Tensor y, at::Tensor x, at::Tensor w, c10::optional<at::Tensor> scale, c10::optional<at::Tensor> bias,
          int64_t l2_keep) {
  gemv_impl(y, x, w, scale, bias, false, l2_keep);
}

void gemv_swiglu(at::Tensor y, at::Tensor x, at::Tensor w, c10::optional<at::Tensor> scale, int64_t l2_keep) {
  gemv_impl(y, x, w, scale, c10::nullopt, true, l2_keep);
}

// `gemv_impl`'s product on tensor cores (tensor_core_linear.cu), for 1 to 128 rows of x.
void tensor_core_linear(at::Tensor y, at::Tensor x, at::Tensor w, c10::optional<at::Tensor> scale,
                        c10::optional<at::Tensor> bias, bool swiglu) {
  check(x, "x", at::kBFloat16);
  check_rows(x, "x");
  const GemvWeight weight = check_gemv_weight(x, w, scale);
  const int64_t outputs = check_gemv_output(y, x, w, swiglu);
  const c10::cuda::CUDAGuard guard(x.device());
  TORCH_CHECK(q3tts::tensor_core_linear_supported(x.size(0), x.size(1), outputs, weight.kind, swiglu),
              "tensor_core_linear does not take these shapes (see tensor_core_linear_supported)");
  const void* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(!swiglu, "a SwiGLU product takes no bias");
    check(*bias, "bias", at::kBFloat16);
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == w.size(0), "bias must be [out]");
    b = bias->data_ptr();
  }
  ok(q3tts::tensor_core_linear(y.data_ptr(), x.data_ptr(), w.data_ptr(), weight.scale, b, x.size(0), x.size(1),
                               outputs, x.stride(0), y.stride(0), weight.kind, swiglu, stream()),
     "tensor_core_linear");
}

// Whether `tensor_core_linear` takes `rows` activation rows with the weight w ([out, in]; [2 * outputs, in] with
// `swiglu`) on this device.
bool tensor_core_linear_supported(int64_t rows, at::Tensor w, bool swiglu) {
  const c10::optional<q3tts::WeightKind> kind = weight_kind(w.scalar_type());
  if (!kind.has_value() || !w.is_cuda() || w.dim() != 2 || (swiglu && w.size(0) % 2 != 0)) return false;
  const c10::cuda::CUDAGuard guard(w.device());
  return q3tts::tensor_core_linear_supported(rows, w.size(1), swiglu ? w.size(0) / 2 : w.size(0), *kind, swiglu);
}

void snake_beta(at::Tensor out, at::Tensor x, at::Tensor freq, at::Tensor inv_beta, c10::optional<at::Tensor> bias) {
  const at::ScalarType dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "x must be float32 or bfloat16");
  check(x, "x", dtype);
  check(out, "out", dtype);
  check(freq, "freq", dtype);
  check(inv_beta, "inv_beta", dtype);
  TORCH_CHECK(x.dim() == 3, "x must be [batch, channels, length]");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == x.sizes(), "out must be contiguous like x");
  TORCH_CHECK(freq.is_contiguous() && inv_beta.is_contiguous() && freq.numel() == x.size(1) &&
                  inv_beta.numel() == x.size(1),
              "freq and inv_beta must be contiguous [channels]");
  const void* b = nullptr;
  if (bias.has_value()) {
    check(*bias, "bias", dtype);
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == x.size(1), "bias must be contiguous [channels]");
    b = bias->data_ptr();
  }
  const c10::cuda::CUDAGuard guard(x.device());
  ok(q3tts::snake_beta(out.data_ptr(), x.data_ptr(), freq.data_ptr(), inv_beta.data_ptr(), b, x.size(0),
                       x.size(1), x.size(2), x.stride(0), x.stride(1), x.stride(2), dtype == at::kBFloat16,
                       stream()),
     "snake_beta");
}

// The samples [history | x] of a conv input (float32 or bf16, any strides), checked.
q3tts::UnfoldInput conv_samples(const at::Tensor& x, const c10::optional<at::Tensor>& history) {
  const at::ScalarType dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "x must be float32 or bfloat16");
  check(x, "x", dtype);
  TORCH_CHECK(x.dim() == 3, "x must be [batch, channels, samples]");
  q3tts::UnfoldInput input{nullptr, x.data_ptr(), x.size(0), x.size(1), 0, {0, 0, 0},
                           {x.stride(0), x.stride(1), x.stride(2)}};
  if (history.has_value()) {
    check(*history, "history", dtype);
    TORCH_CHECK(history->dim() == 3 && history->size(0) == x.size(0) && history->size(1) == x.size(1),
                "history must be [batch, channels, context] like x");
    input.history = history->data_ptr();
    input.context = history->size(2);
    for (int i = 0; i < 3; ++i) input.history_strides[i] = history->stride(i);
  }
  return input;
}

// Output steps of a conv of `kernel` taps at `dilation` over the samples.
int64_t conv_length(const q3tts::UnfoldInput& input, const at::Tensor& x, int64_t kernel, int64_t dilation) {
  TORCH_CHECK(kernel >= 1 && dilation >= 1, "kernel and dilation must be positive");
  const int64_t length = input.context + x.size(2) - (kernel - 1) * dilation;
  TORCH_CHECK(length >= 1, "the samples are shorter than the kernel's span");
  return length;
}

// SnakeBeta(x + bias) for x's samples, checked: `frequency` and `inverse_beta` (and optionally `bias`), and `tail`
// [B, C, n] (optional), n <= `steps`, for the activation of the last n samples read. None without `frequency`.
c10::optional<q3tts::SnakeParameters> snake_parameters(const at::Tensor& x, int64_t steps,
                                                      const c10::optional<at::Tensor>& frequency,
                                                      const c10::optional<at::Tensor>& inverse_beta,
                                                      const c10::optional<at::Tensor>& bias,
                                                      const c10::optional<at::Tensor>& tail) {
  TORCH_CHECK(frequency.has_value() == inverse_beta.has_value() &&
                  (frequency.has_value() || (!bias.has_value() && !tail.has_value())),
              "SnakeBeta needs frequency and inverse_beta (bias and tail optional)");
  if (!frequency.has_value()) return c10::nullopt;
  const auto channel_vector = [&](const at::Tensor& t, const char* name) -> const void* {
    check(t, name, x.scalar_type());
    TORCH_CHECK(t.is_contiguous() && t.numel() == x.size(1), name, " must be contiguous [channels]");
    return t.data_ptr();
  };
  q3tts::SnakeParameters snake{channel_vector(*frequency, "frequency"), channel_vector(*inverse_beta, "inverse_beta"),
                               bias.has_value() ? channel_vector(*bias, "bias") : nullptr};
  if (tail.has_value()) {
    check(*tail, "tail", x.scalar_type());
    TORCH_CHECK(tail->is_contiguous() && tail->dim() == 3 && tail->size(0) == x.size(0) &&
                    tail->size(1) == x.size(1) && tail->size(2) >= 1 && tail->size(2) <= steps,
                "tail must be contiguous [batch, channels, n] with 1 <= n <= the conv's steps");
    snake.tail = tail->data_ptr();
    snake.tail_length = tail->size(2);
  }
  return snake;
}

// With `frequency` and `inverse_beta`, x's samples go through SnakeBeta (`snake_parameters`).
void unfold_columns(at::Tensor out, at::Tensor x, c10::optional<at::Tensor> history, int64_t kernel,
                    int64_t dilation, c10::optional<at::Tensor> frequency, c10::optional<at::Tensor> inverse_beta,
                    c10::optional<at::Tensor> bias, c10::optional<at::Tensor> tail) {
  const q3tts::UnfoldInput input = conv_samples(x, history);
  const int64_t length = conv_length(input, x, kernel, dilation);
  check(out, "out", x.scalar_type());
  TORCH_CHECK(out.is_contiguous() && out.dim() == 2 && out.size(0) == x.size(1) * kernel &&
                  out.size(1) == x.size(0) * length,
              "out must be contiguous [channels * kernel, batch * (samples - span)]");
  const auto snake = snake_parameters(x, length, frequency, inverse_beta, bias, tail);
  const c10::cuda::CUDAGuard guard(x.device());
  ok(q3tts::unfold_columns(out.data_ptr(), input, snake.has_value() ? &*snake : nullptr, kernel, length, dilation,
                           static_cast<int>(x.element_size()), stream()),
     "unfold_columns");
}

// The samples [history | x] (x's through SnakeBeta with `frequency`) time-major into out [B * L, C].
void time_major_samples(at::Tensor out, at::Tensor x, c10::optional<at::Tensor> history,
                        c10::optional<at::Tensor> frequency, c10::optional<at::Tensor> inverse_beta,
                        c10::optional<at::Tensor> bias, c10::optional<at::Tensor> tail) {
  const q3tts::UnfoldInput input = conv_samples(x, history);
  const int64_t length = conv_length(input, x, 1, 1);
  check(out, "out", x.scalar_type());
  TORCH_CHECK(out.is_contiguous() && out.dim() == 2 && out.size(0) == x.size(0) * length && out.size(1) == x.size(1),
              "out must be contiguous [batch * (context + samples), channels]");
  const auto snake = snake_parameters(x, length, frequency, inverse_beta, bias, tail);
  const c10::cuda::CUDAGuard guard(x.device());
  ok(q3tts::time_major_samples(out.data_ptr(), input, snake.has_value() ? &*snake : nullptr, length,
                               static_cast<int>(x.element_size()), stream()),
     "time_major_samples");
}

void conv_to_one_channel(at::Tensor out, at::Tensor x, c10::optional<at::Tensor> history, at::Tensor weight,
                         c10::optional<at::Tensor> bias, int64_t dilation) {
  const q3tts::UnfoldInput input = conv_samples(x, history);
  check(weight, "weight", x.scalar_type());
  TORCH_CHECK(weight.is_contiguous() && weight.dim() == 3 && weight.size(0) == 1 && weight.size(1) == x.size(1),
              "weight must be contiguous [1, channels, kernel]");
  const int64_t kernel = weight.size(2);
  const int64_t length = conv_length(input, x, kernel, dilation);
  const void* b = nullptr;
  if (bias.has_value()) {
    check(*bias, "bias", x.scalar_type());
    TORCH_CHECK(bias->numel() == 1, "bias must have one element");
    b = bias->data_ptr();
  }
  check(out, "out", x.scalar_type());
  TORCH_CHECK(out.is_contiguous() && out.numel() == x.size(0) * length, "out must be contiguous [batch, 1, steps]");
  const c10::cuda::CUDAGuard guard(x.device());
  ok(q3tts::conv_to_one_channel(out.data_ptr(), input, weight.data_ptr(), b, kernel, length, dilation,
                                static_cast<int>(x.element_size()), stream()),
     "conv_to_one_channel");
}

void interleave_phases(at::Tensor out, at::Tensor rows, at::Tensor bias, int64_t phases) {
  const at::ScalarType dtype = rows.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "rows must be float32 or bfloat16");
  check(rows, "rows", dtype);
  check(bias, "bias", dtype);
  check(out, "out", dtype);
  TORCH_CHECK(rows.dim() == 2 && rows.is_contiguous() && phases >= 1 && rows.size(0) % phases == 0 &&
                  rows.size(1) % 2 == 0,
              "rows must be contiguous [channels * phases, columns], columns even");
  TORCH_CHECK(bias.is_contiguous() && bias.numel() == rows.size(0), "bias must be contiguous [channels * phases]");
  TORCH_CHECK(out.is_contiguous() && out.numel() == rows.numel(), "out must be contiguous, rows' size");
  const c10::cuda::CUDAGuard guard(rows.device());
  ok(q3tts::interleave_phases(out.data_ptr(), rows.data_ptr(), bias.data_ptr(), rows.size(0) / phases, phases,
                              rows.size(1), static_cast<int>(rows.element_size()), stream()),
     "interleave_phases");
}

// The codec transformer's window attention for one pass (launchers.h, `codec_window_attention`).
void codec_window_attention(at::Tensor out, at::Tensor next_cache, at::Tensor qkv, at::Tensor cos, at::Tensor sin,
                            at::Tensor cache, at::Tensor positions) {
  const at::ScalarType dtype = qkv.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "qkv must be float32 or bfloat16");
  for (const auto& [t, name] : {std::pair{&qkv, "qkv"}, {&cos, "cos"}, {&sin, "sin"}, {&cache, "cache"},
                                {&out, "out"}, {&next_cache, "next_cache"}}) {
    check(*t, name, dtype);
  }
  check(positions, "positions", at::kLong);
  TORCH_CHECK(qkv.dim() == 5 && qkv.is_contiguous(),
              "qkv must be contiguous [batch, frames, kv_heads, group + 2, dim]");
  const int64_t batch = qkv.size(0), frames = qkv.size(1), kv_heads = qkv.size(2), dim = qkv.size(4);
  const int64_t group = qkv.size(3) - 2;
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == batch * frames * (group + 2) * dim &&
                  sin.numel() == cos.numel(),
              "cos and sin must be contiguous [batch, frames, 1, group + 2, dim]");
  TORCH_CHECK(cache.dim() == 4 && cache.size(0) == batch && cache.size(1) == kv_heads && cache.size(3) == 2 * dim &&
                  cache.stride(3) == 1,
              "cache must be [batch, kv_heads, window - 1, 2 * dim] with a contiguous last dim");
  const int64_t vector = 16 / cache.element_size();
  TORCH_CHECK(reinterpret_cast<uintptr_t>(cache.data_ptr()) % 16 == 0 && cache.stride(0) % vector == 0 &&
                  cache.stride(1) % vector == 0 && cache.stride(2) % vector == 0,
              "cache rows must be 16-byte aligned");
  TORCH_CHECK(next_cache.is_contiguous() && next_cache.sizes() == cache.sizes(),
              "next_cache must be contiguous like cache");
  TORCH_CHECK(out.is_contiguous() && out.numel() == batch * frames * kv_heads * group * dim,
              "out must be contiguous [batch, frames, heads * dim]");
  TORCH_CHECK(positions.is_contiguous() && positions.numel() == batch, "positions must be contiguous [batch]");
  const q3tts::CodecWindowShape shape{static_cast<int>(batch),      static_cast<int>(frames),
                                      static_cast<int>(kv_heads),   static_cast<int>(group),
                                      static_cast<int>(dim),        static_cast<int>(cache.size(2) + 1),
                                      {cache.stride(0), cache.stride(1), cache.stride(2)}};
  const c10::cuda::CUDAGuard guard(qkv.device());
  ok(q3tts::codec_window_attention(out.data_ptr(), next_cache.data_ptr(), qkv.data_ptr(), cos.data_ptr(),
                                   sin.data_ptr(), cache.data_ptr(), positions.data_ptr<int64_t>(), shape,
                                   static_cast<int>(qkv.element_size()), stream()),
     "codec_window_attention");
}

void sample(at::Tensor out, at::Tensor logits, c10::optional<at::Tensor> seen, at::Tensor penalty,
            c10::optional<at::Tensor> suppress, c10::optional<at::Tensor> ban_count, int64_t ban_token,
            int64_t ban_below, at::Tensor greedy, at::Tensor temperature, at::Tensor top_k, at::Tensor top_p,
            at::Tensor uniforms, c10::optional<at::Tensor> embed_table, c10::optional<at::Tensor> embed_out,
            c10::optional<at::Tensor> record_slots, c10::optional<at::Tensor> history_table,
            c10::optional<at::Tensor> codes_table, c10::optional<at::Tensor> frame_codes, int64_t codes_column) {
  TORCH_CHECK(logits.is_cuda() && (logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16),
              "logits must be a CUDA float32 or bfloat16 tensor");
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1, "logits must be [rows, vocab]");
  const int64_t rows = logits.size(0);
  check(out, "out", at::kLong);
  check(penalty, "penalty", at::kFloat);
  check(greedy, "greedy", at::kBool);
  check(temperature, "temperature", at::kFloat);
  check(top_k, "top_k", at::kLong);
  check(top_p, "top_p", at::kDouble);
  check(uniforms, "uniforms", at::kDouble);
  for (auto* t : {&penalty, &greedy, &temperature, &top_k, &top_p}) {
    TORCH_CHECK(t->is_contiguous() && t->numel() == rows, "per-row parameters must be contiguous [rows]");
  }
  TORCH_CHECK(out.dim() == 1 && out.size(0) == rows, "out must be [rows]");
  TORCH_CHECK(uniforms.dim() == 1 && uniforms.size(0) == rows, "uniforms must be [rows]");
  q3tts::SamplingArgs a{};
  a.logits = logits.data_ptr();
  a.logits_bf16 = logits.scalar_type() == at::kBFloat16;
  a.logits_stride = logits.stride(0);
  a.vocab = logits.size(1);
  a.rows = rows;
  if (seen.has_value()) {
    check(*seen, "seen", at::kBool);
    TORCH_CHECK(seen->dim() == 2 && seen->stride(1) == 1 && seen->size(1) == a.vocab, "seen must be [rows, vocab]");
    a.seen = reinterpret_cast<const uint8_t*>(seen->data_ptr<bool>());
    a.seen_stride = seen->stride(0);
  }
  a.penalty = penalty.data_ptr<float>();
  if (suppress.has_value()) {
    check(*suppress, "suppress", at::kBool);
    TORCH_CHECK(suppress->is_contiguous() && suppress->numel() == a.vocab, "suppress must be [vocab]");
    a.suppress = reinterpret_cast<const uint8_t*>(suppress->data_ptr<bool>());
  }
  if (ban_count.has_value()) {
    check(*ban_count, "ban_count", at::kLong);
    TORCH_CHECK(ban_count->is_contiguous() && ban_count->numel() == rows, "ban_count must be [rows]");
    a.ban_count = ban_count->data_ptr<int64_t>();
  }
  a.ban_token = static_cast<int>(ban_token);
  a.ban_below = static_cast<int>(ban_below);
  a.greedy = reinterpret_cast<const uint8_t*>(greedy.data_ptr<bool>());
  a.temperature = temperature.data_ptr<float>();
  a.top_k = top_k.data_ptr<int64_t>();
  a.top_p = top_p.data_ptr<double>();
  a.uniforms = uniforms.data_ptr<double>();
  a.uniforms_stride = uniforms.stride(0);
  a.out = out.data_ptr<int64_t>();
  a.out_stride = out.stride(0);
  TORCH_CHECK(embed_table.has_value() == embed_out.has_value(), "embed_table and embed_out go together");
  if (embed_table.has_value()) {
    check(*embed_table, "embed_table", at::kBFloat16);
    check(*embed_out, "embed_out", at::kBFloat16);
    TORCH_CHECK(embed_table->dim() == 2 && embed_table->is_contiguous() && embed_table->size(0) == a.vocab &&
                    embed_table->size(1) % 8 == 0,
                "embed_table must be contiguous [vocab, width] with width a multiple of 8");
    TORCH_CHECK(embed_out->size(0) == rows && embed_out->size(1) == embed_table->size(1),
                "embed_out must be [rows, width]");
    check_rows(*embed_out, "embed_out");
    TORCH_CHECK(reinterpret_cast<uintptr_t>(embed_table->data_ptr()) % 16 == 0,
                "embed_table must be 16-byte aligned");
    a.embed_table = embed_table->data_ptr();
    a.embed_out = embed_out->data_ptr();
    a.embed_width = static_cast<int>(embed_table->size(1));
    a.embed_stride = static_cast<int>(embed_out->stride(0));
  }
  TORCH_CHECK(!(history_table.has_value() || codes_table.has_value()) || record_slots.has_value(),
              "the records need record_slots");
  TORCH_CHECK(codes_table.has_value() == frame_codes.has_value(), "codes_table and frame_codes go together");
  if (record_slots.has_value()) {
    check(*record_slots, "record_slots", at::kLong);
    TORCH_CHECK(record_slots->is_contiguous() && record_slots->numel() == rows, "record_slots must be [rows]");
    a.record_slots = record_slots->data_ptr<int64_t>();
  }
  if (history_table.has_value()) {
    check(*history_table, "history_table", at::kBool);
    TORCH_CHECK(history_table->dim() == 2 && history_table->stride(1) == 1 && history_table->size(1) == a.vocab,
                "history_table must be [slots, vocab]");
    a.history_table = reinterpret_cast<uint8_t*>(history_table->data_ptr<bool>());
    a.history_stride = history_table->stride(0);
  }
  if (codes_table.has_value()) {
    check(*codes_table, "codes_table", at::kLong);
    check(*frame_codes, "frame_codes", at::kLong);
    TORCH_CHECK(codes_table->dim() == 2 && codes_table->is_contiguous() && frame_codes->dim() == 2 &&
                    frame_codes->is_contiguous() && frame_codes->size(0) == rows &&
                    frame_codes->size(1) == codes_table->size(1) && codes_column >= 0 &&
                    codes_column < frame_codes->size(1) && frame_codes->size(1) <= 512,
                "codes_table [slots, width] and frame_codes [rows, width] must be contiguous, the column inside");
    TORCH_CHECK(out.data_ptr<int64_t>() == frame_codes->data_ptr<int64_t>() + codes_column &&
                    out.stride(0) == frame_codes->size(1),
                "out must be frame_codes' column codes_column");
    a.codes_table = codes_table->data_ptr<int64_t>();
    a.frame_codes = frame_codes->data_ptr<int64_t>();
    a.codes_width = static_cast<int>(frame_codes->size(1));
    a.codes_column = static_cast<int>(codes_column);
  }
  const c10::cuda::CUDAGuard guard(logits.device());
  ok(q3tts::sample(a, stream()), "sample");
}

// Graphs captured afterwards get (or lose) programmatic dependent launch; see launch.cuh.
void set_dependent_launch(bool enabled) { q3tts::dependent_launch_enabled() = enabled; }

// Whether launches get programmatic dependent launch now (switched on and the device supports it): the Triton
// kernels of the same chains follow it (ops.dependent_launch).
bool dependent_launch() { return q3tts::dependent_launch_enabled() && q3tts::device_supports_dependent_launch(); }

// The per-row layout of one tensor of a copy_rows pair: up to three dims after the row dim (padded in front
// with size 1), the last contiguous; strides in bytes.
struct RowLayout {
  int64_t sizes[3];    // outer, middle, inner
  int64_t strides[3];  // row, outer, middle
};

RowLayout row_layout(const at::Tensor& t) {
  TORCH_CHECK(t.dim() >= 1 && t.dim() <= 4, "copy_rows takes tensors of 1 to 4 dims");
  RowLayout layout{{1, 1, 1}, {0, 0, 0}};
  const int64_t element = t.element_size();
  layout.strides[0] = t.stride(0) * element;
  const int64_t extra = t.dim() - 1;
  for (int64_t d = 0; d < extra; ++d) {
    const int64_t slot = 3 - extra + d;  // 0 outer, 1 middle, 2 inner
    layout.sizes[slot] = t.size(1 + d);
    if (slot < 2) layout.strides[1 + slot] = t.stride(1 + d) * element;  // the inner dim is contiguous
  }
  TORCH_CHECK(extra == 0 || t.size(-1) == 1 || t.stride(-1) == 1, "copy_rows needs a contiguous last dim");
  return layout;
}

// dsts[i] and srcs[i] (same dtype, same sizes after the row dim): gathering, dst[r] = src[index[r]]; else
// dst[index[r]] = src[r]. One kernel for all pairs (csrc/row_copy.cu).
void copy_rows(std::vector<at::Tensor> dsts, std::vector<at::Tensor> srcs, at::Tensor index, bool gather) {
  check(index, "index", at::kLong);
  TORCH_CHECK(index.dim() == 1 && index.is_contiguous(), "index must be a contiguous 1-D tensor");
  TORCH_CHECK(dsts.size() == srcs.size(), "copy_rows needs as many sources as targets");
  const int64_t rows = index.numel();
  std::vector<q3tts::RowCopyTask> tasks;
  tasks.reserve(dsts.size());
  for (size_t i = 0; i < dsts.size(); ++i) {
    const at::Tensor& dst = dsts[i];
    const at::Tensor& src = srcs[i];
    check_cuda(dst, "target");
    check_cuda(src, "source");
    TORCH_CHECK(dst.device() == index.device() && src.device() == index.device(), "copy_rows: one device");
    TORCH_CHECK(dst.scalar_type() == src.scalar_type(), "copy_rows: a target and its source differ in dtype");
    TORCH_CHECK(dst.dim() == src.dim() && dst.sizes().slice(1) == src.sizes().slice(1),
                "copy_rows: a target and its source differ in shape after the row dim");
    TORCH_CHECK((gather ? dst.size(0) : src.size(0)) >= rows, "copy_rows: fewer rows than indices");
    const RowLayout d = row_layout(dst), s = row_layout(src);
    const int64_t inner_bytes = d.sizes[2] * dst.element_size();
    TORCH_CHECK(inner_bytes < (int64_t{1} << 31) && d.sizes[0] < (int64_t{1} << 31) &&
                    d.sizes[1] < (int64_t{1} << 31), "copy_rows: a row dim is too large");
    if (inner_bytes == 0 || d.sizes[0] == 0 || d.sizes[1] == 0) continue;
    int64_t granule = 16;
    for (int64_t v : {inner_bytes, d.strides[0], d.strides[1], d.strides[2], s.strides[0], s.strides[1],
                      s.strides[2], static_cast<int64_t>(reinterpret_cast<uintptr_t>(dst.data_ptr())),
                      static_cast<int64_t>(reinterpret_cast<uintptr_t>(src.data_ptr())) }) {
      granule = std::gcd(granule, v);
    }
    q3tts::RowCopyTask task{};
    task.dst = static_cast<char*>(dst.data_ptr());
    task.src = static_cast<const char*>(src.data_ptr());
    for (int j = 0; j < 3; ++j) {
      task.dst_strides[j] = d.strides[j];
      task.src_strides[j] = s.strides[j];
    }
    task.outer = static_cast<int>(d.sizes[0]);
    task.middle = static_cast<int>(d.sizes[1]);
    task.inner_bytes = static_cast<int>(inner_bytes);
    task.granule = static_cast<int>(granule);
    tasks.push_back(task);
  }
  const c10::cuda::CUDAGuard guard(index.device());
  ok(q3tts::copy_rows(tasks.data(), static_cast<int>(tasks.size()), index.data_ptr<int64_t>(),
                      static_cast<int>(rows), gather, stream()),
     "copy_rows");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "qwen3-tts-native CUDA kernels";
  m.def("rms_norm", &rms_norm);
  m.def("rms_norm_fp8", &rms_norm_fp8);
  m.def("rms_norm_split_sums", &rms_norm_split_sums);
  m.def("qk_norm_rope_cache", &qk_norm_rope_cache);
  m.def("decode_attention_workspace", &decode_attention_workspace);
  m.def("decode_attention", &decode_attention);
  m.def("rope_attention", &rope_attention);
  m.def("silu_mul", &silu_mul);
  m.def("silu_mul_fp8", &silu_mul_fp8);
  m.def("quantize_rows_fp8", &quantize_rows_fp8);
  m.def("frame_embedding", &frame_embedding);
  m.def("gemv", &gemv);
  m.def("gemv_swiglu", &gemv_swiglu);
  m.def("gemv_rms_norm", &gemv_rms_norm);
  m.def("tensor_core_linear", &tensor_core_linear);
  m.def("tensor_core_linear_supported", &tensor_core_linear_supported);
  m.def("sample", &sample);
  m.def("snake_beta", &snake_beta);
  m.def("unfold_columns", &unfold_columns);
  m.def("time_major_samples", &time_major_samples);
  m.def("conv_to_one_channel", &conv_to_one_channel);
  m.def("interleave_phases", &interleave_phases);
  m.def("codec_window_attention", &codec_window_attention);
  m.def("copy_rows", &copy_rows);
  m.def("set_dependent_launch", &set_dependent_launch);
  m.def("dependent_launch", &dependent_launch);
}
