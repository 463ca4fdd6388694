// Host launchers of the CUDA kernels. Plain pointers and sizes only, so the .cu files build with nvcc
// alone (no torch headers); bindings.cpp checks tensors and calls these on the current stream.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace q3tts {

enum class WeightKind : int { kBf16 = 0, kInt8 = 1, kFp8E4M3 = 2 };

// out[r] = bf16(bf16(s * rsqrt(mean(s^2) + eps)) * weight), s = x[r] (or bf16(x[r] + residual[r]) when
// residual is not null, in which case residual[r] is overwritten with s). Rows are `stride` elements apart.
cudaError_t rms_norm(void* out, const void* x, void* residual, const void* weight, int rows, int hidden,
                     int x_stride, int out_stride, float eps, cudaStream_t stream);

// `rms_norm` with a residual whose added rows are the float32 partial sums of a product split over k:
// partials[s * split_stride + r * hidden + c], `splits` of them (4 only: triton_products.DOWN_SPLITS), added
// in split order from zero and rounded once to bf16, as the product's reduce would round them. With `scale`
// (non-null) the norm is quantized as `rms_norm_fp8` quantizes it: `out` is codes contiguous [rows, hidden].
cudaError_t rms_norm_split_sums(void* out, float* scale, const float* partials, int splits, int64_t split_stride,
                                void* residual, const void* weight, int rows, int hidden, int residual_stride,
                                int out_stride, float eps, cudaStream_t stream);

// `rms_norm`'s row quantized as `quantize_rows_fp8` quantizes it: codes contiguous [rows, hidden], scale [rows].
cudaError_t rms_norm_fp8(void* codes, float* scale, const void* x, void* residual, const void* weight, int rows,
                         int hidden, int x_stride, float eps, cudaStream_t stream);

// Per-head q/k RMSNorm (fp32 statistics), rotate-half RoPE from bf16 cos/sin tables [positions, D],
// then K/V written to cache[slot, kv_head, position, :]. q/k/v rows are `*_stride` elements apart.
// q_out is [batch, q_heads, D]. Caches are one layer's [slots, kv_heads, max_len, D]: bf16, or e4m3 codes
// when k_scale / v_scale (their rows' scales, [slots, kv_heads, max_len]) are given (kv_cache.cuh). k_out
// (nullable): the roped keys also as [batch, kv_heads, D], in bf16.
cudaError_t qk_norm_rope_cache(void* q_out, const void* q, const void* k, const void* v, int q_stride,
                               int k_stride, int v_stride, const void* q_norm, const void* k_norm,
                               const void* cos, const void* sin, const int64_t* positions,
                               const int64_t* slots, void* k_cache, void* v_cache, float* k_scale,
                               float* v_scale, void* k_out, int batch,
                               int q_heads, int kv_heads, int head_dim, int max_len, float eps,
                               cudaStream_t stream);

// Split-K decode attention of one query per row over its slot's first lengths[b] cache entries.
// q [batch, q_heads, D]; out [batch, q_heads, D]; workspace holds batch*q_heads*num_splits(span)*(D+2) floats.
// The grid covers the first `span` (<= max_len) positions, so every lengths[b] must be <= span; the result
// does not depend on span (a split's partial depends only on its own keys, and a single live split merges
// to exactly its own normalised output). Caches (and k_scale / v_scale) as qk_norm_rope_cache's.
cudaError_t decode_attention(void* out, const void* q, const void* k_cache, const void* v_cache,
                             const float* k_scale, const float* v_scale, const int64_t* slots,
                             const int64_t* lengths, float* workspace, int batch, int q_heads, int kv_heads,
                             int head_dim, int max_len, int span, int split_len, float scale, cudaStream_t stream);
int decode_attention_splits(int max_len, int split_len);

// qk_norm_rope_cache then decode_attention in one kernel (plus the merge kernel when max_len > 64), for
// rows with distinct slots: the new token's q/k are normed and roped, its K/V written to
// cache[slot, :, position], and out [batch, q_heads, D] is the attention of its queries over positions
// 0..position. Bit-identical to the two. `workspace` as decode_attention's (may be null when max_len <= 64).
cudaError_t rope_attention(void* out, float* workspace, const void* q, const void* k, const void* v, int q_stride,
                           int k_stride, int v_stride, const void* q_norm, const void* k_norm, const void* cos,
                           const void* sin, const int64_t* positions, const int64_t* slots, void* k_cache,
                           void* v_cache, float* k_scale, float* v_scale, int batch, int q_heads, int kv_heads,
                           int head_dim, int max_len, float eps, float scale, cudaStream_t stream);

// The talker's decode-step input: out[r] = bf16(bf16(sum_j E_j[codes[r, j]]) + text[r]) over the `groups`
// codebooks, E_0 = first_table [first_vocab, width] and E_j = tables[j - 1] ([groups - 1, vocab, width]), the sum
// in fp32 in codebook order and rounded once (the reference's stacked bf16 sum; it may add in another order,
// so a sum can round 1 ulp apart). A code outside its table adds zeros. out is contiguous [rows, width]. Row r
// embeds codes row code_rows[r] when code_rows is not null.
cudaError_t frame_embedding(void* out, const int64_t* codes, int code_stride, const int64_t* code_rows,
                            const void* first_table, int first_vocab, const void* tables, int vocab, const void* text,
                            int text_stride, int rows, int groups, int width, cudaStream_t stream);

// out = bf16(bf16(silu(gate)) * up), rows `*_stride` elements apart, `cols` wide.
cudaError_t silu_mul(void* out, const void* gate, const void* up, int rows, int cols, int gate_stride,
                     int up_stride, int out_stride, cudaStream_t stream);

// `silu_mul`'s row quantized as `quantize_rows_fp8` quantizes it: codes contiguous [rows, cols], scale [rows];
// cols <= 8192.
cudaError_t silu_mul_fp8(void* codes, float* scale, const void* gate, const void* up, int rows, int cols,
                         int gate_stride, int up_stride, cudaStream_t stream);

// y[n, :m] = bf16(x[n, :k] @ W[m, k]^T * scale[m] + bias[m]); scale may be null (bf16 weights),
// bias may be null. Each output row's reduction order is fixed, whatever n is (batch invariant).
// With `swiglu`, W is the fused [gate; up] weight [2m, k] (gate rows first, no bias) and
// y[n, :m] = bf16(bf16(silu(gate)) * up) of the two rounded products (swiglu.cu's expression).
// l2_keep ranks the weight's loads in the L2: < 0 no hint; else its first l2_keep bytes evict_last (kept for a
// later read, as the code predictor's weights are 15 times a frame) and the rest evict_first (streamed once).
cudaError_t gemv(void* y, const void* x, const void* w, const float* scale, const void* bias, int n,
                 int k, int m, int x_stride, int y_stride, WeightKind kind, bool swiglu, int64_t l2_keep,
                 cudaStream_t stream);

// `gemv` of RMSNorm(x + delta) * norm_weight (no bias), for n <= 4 rows, in one kernel: each block norms the
// rows into shared memory before it streams its weights, rounding as `rms_norm` with a residual does (only
// the fp32 sum of squares is added in another order). delta may be null (a plain RMSNorm of x); when sum_out
// is not null, x + delta is written there. x, delta and sum_out rows are x_stride apart, k <= 6144.
cudaError_t gemv_rms_norm(void* y, const void* x, const void* delta, void* sum_out, const void* norm_weight,
                          float eps, const void* w, const float* scale, int n, int k, int m, int x_stride,
                          int y_stride, WeightKind kind, bool swiglu, int64_t l2_keep, cudaStream_t stream);

// `gemv`'s product (y[n, :m] = bf16(x @ W^T * scale + bias), or with `swiglu` the SwiGLU of the fused [gate; up]
// weight [2m, k]) on tensor cores, for 1 to 128 activation rows and bf16 or fp8 weights (tensor_core_linear.cu):
// the fp32 sums of the same products in another order. Needs compute capability 9.0, k a multiple of 64 and m a
// multiple of 64 (32 with swiglu): `tensor_core_linear_supported`; x rows x_stride apart (a multiple of 8).
bool tensor_core_linear_supported(int n, int k, int m, WeightKind kind, bool swiglu);
cudaError_t tensor_core_linear(void* y, const void* x, const void* w, const float* scale, const void* bias, int n,
                               int k, int m, int x_stride, int y_stride, WeightKind kind, bool swiglu,
                               cudaStream_t stream);

// out[r, :] = e4m3(x[r, :] * (448 / a)) (saturating, round to nearest even) and scale[r] = a / 448, a = max(amax
// of the row, 1e-12), each operation correctly rounded: the per-row activation quantization of `ops.fp8_linear`.
// x rows are x_stride elements apart (a multiple of 8); out is contiguous [rows, cols], cols a multiple of 8.
cudaError_t quantize_rows_fp8(void* out, float* scale, const void* x, int rows, int cols, int x_stride,
                              cudaStream_t stream);

// out[b, c, t] = x + inv_beta[c] * sin(x * freq[c])^2 with x = x[b, c, t] (+ bias[c] first, when bias is not
// null; element strides given), rounded op by op as the torch reference rounds it (fp32, or bf16 after
// every op), so bit-identical to it: in bf16 with a fast sine that rounds to the same bf16 as sinf at every
// bf16 argument (snake.cu says why). out is contiguous [B, C, T].
cudaError_t snake_beta(void* out, const void* x, const void* freq, const void* inv_beta, const void* bias,
                       int64_t batch, int64_t channels, int64_t length, int64_t batch_stride,
                       int64_t channel_stride, int64_t time_stride, bool is_bf16, cudaStream_t stream);

// The unfolded input of a conv as a GEMM over the samples s = [history | x] (`context` history samples, then
// x's; no history when context is 0): out[(c * K + k) * B + b, t] = s[b, c, k * dilation + t], out contiguous
// [C * K, B * T], T = context + x's samples - (K - 1) * dilation. A bit-exact copy of float32 (element_bytes
// 4) or bfloat16 (2) elements; element strides given.
struct UnfoldInput {
  const void* history;  // [B, C, context] or null
  const void* x;        // [B, C, samples]
  int64_t batch, channels, context;
  int64_t history_strides[3];
  int64_t x_strides[3];
};
// SnakeBeta(x + bias) per channel (snake.cuh) applied to the samples of x (not the history's) as a kernel reads
// them: frequency and inverse_beta [C], bias [C] or null, contiguous, of the samples' type. `tail` (contiguous
// [B, C, tail_length], tail_length <= T, or null) receives the activation of x's last tail_length samples, the
// next pass's history, so the activation is never written out whole.
struct SnakeParameters {
  const void* frequency;
  const void* inverse_beta;
  const void* bias;
  void* tail = nullptr;
  int64_t tail_length = 0;
};
// `snake` null: the samples as they are.
cudaError_t unfold_columns(void* out, const UnfoldInput& input, const SnakeParameters* snake, int64_t kernel,
                           int64_t length, int64_t dilation, int element_bytes, cudaStream_t stream);

// The same samples time-major: out[b * length + s, c] = s[b, c, s], out contiguous [B * length, C], length =
// context + x's samples; `snake` as for unfold_columns (its tail: the last tail_length samples). Bit-exact.
cudaError_t time_major_samples(void* out, const UnfoldInput& input, const SnakeParameters* snake, int64_t length,
                               int element_bytes, cudaStream_t stream);

// out[b, t] = bias + sum over c, k of weight[c, k] * s[b, c, k * dilation + t] (fp32 sums, rounded once to the
// element type): the conv of the same samples to one output channel, computed directly instead of unfolded.
// out contiguous [B, length]; weight contiguous [C, K]; bias one element or null.
cudaError_t conv_to_one_channel(void* out, const UnfoldInput& input, const void* weight, const void* bias,
                                int64_t kernel, int64_t length, int64_t dilation, int element_bytes,
                                cudaStream_t stream);

// The transposed convs' GEMM output in sample order: out[c, n, r] = rows[c * phases + r, n] + bias[c * phases + r]
// (one rounding), rows contiguous [channels * phases, columns], bias [channels * phases], out contiguous
// [channels, columns * phases]; 1 <= phases <= 8, columns even, rows aligned to two elements, float32
// (element_bytes 4) or bfloat16 (2).
cudaError_t interleave_phases(void* out, const void* rows, const void* bias, int64_t channels, int64_t phases,
                              int64_t columns, int element_bytes, cudaStream_t stream);

// The codec transformer's sliding-window attention for a pass of `frames` frames (codec_attention.cu): qkv
// contiguous [B, frames, kv_heads, group + 2, head_dim] (per KV head its group's query rows, its key, its
// value), cos and sin contiguous [B, frames, group + 2, head_dim], cache [B, kv_heads, window - 1, 2 * head_dim]
// (keys then values; strides in elements, each a multiple of 16 bytes, the last dim contiguous, 16-byte aligned),
// positions [B] (the pass's first frame).
// Writes out contiguous [B, frames, kv_heads * group * head_dim] and next_cache contiguous like cache: the last
// window - 1 slots of the cache followed by the pass's keys and values. head_dim must be 64.
struct CodecWindowShape {
  int batch, frames, kv_heads, group, head_dim, window;
  int64_t cache_strides[3];
};
cudaError_t codec_window_attention(void* out, void* next_cache, const void* qkv, const void* cos, const void* sin,
                                   const void* cache, const int64_t* positions, const CodecWindowShape& shape,
                                   int element_bytes, cudaStream_t stream);

// One fused sampling step per row (block per row, vocab <= 4096), the rules of
// engine/runtime/sampling.py: repetition penalty over `seen`, bans, greedy argmax (lowest index on ties),
// temperature, top-k keeping ties, top-p over a stable ascending sort, then the inverse-CDF draw with the
// row's uniform over w_i = exp(s_i - max) in index order with a float64 running sum.
// With `embed_table`, the block also writes embed_table[chosen] (a bf16 [vocab, embed_width] table) to
// row `row` of `embed_out`, so the next step's input needs no kernel of its own (zeros for an id outside
// the table, which the float rules above never choose). With `record_slots`, it also records the draw in its
// row's slot: the cb0 history's bit, or (the frame's last draw) the frame's whole row of codes, read from
// `frame_codes`, which the frame's earlier draws have written (kernels of one stream: each waited for the
// one before it).
struct SamplingArgs {
  const void* logits;        // [rows, vocab], row stride logits_stride: fp32, or bf16 when logits_bf16
  bool logits_bf16;
  int logits_stride;
  int vocab;
  int rows;
  const uint8_t* seen;       // [rows, vocab] bool history or null (no penalty)
  int seen_stride;
  const float* penalty;      // [rows]
  const uint8_t* suppress;   // [vocab] always-banned ids or null
  const int64_t* ban_count;  // [rows] cb0 tokens so far (EOS banned while < ban_below), or null
  int ban_token;
  int ban_below;
  const uint8_t* greedy;     // [rows]
  const float* temperature;  // [rows]
  const int64_t* top_k;      // [rows], 0 = off
  const double* top_p;       // [rows], >= 1 = off
  const double* uniforms;    // [rows] u in [0, 1), row stride uniforms_stride
  int uniforms_stride;
  int64_t* out;              // [rows], row stride out_stride
  int out_stride;
  const void* embed_table;   // bf16 [vocab, embed_width] or null
  void* embed_out;           // bf16 [rows, embed_width], row stride embed_stride
  int embed_width;           // a multiple of 8
  int embed_stride;          // a multiple of 8
  // The frame's records, per row's slot, so that no kernel follows the frame's last draw (null: none):
  const int64_t* record_slots;  // [rows] each row's slot
  uint8_t* history_table;       // bool [slots, history_stride]: [slot, chosen] set (the talker's cb0 draw)
  int64_t history_stride;
  int64_t* codes_table;         // int64 [slots, codes_width]: row slot <- the row of frame_codes (the last draw)
  const int64_t* frame_codes;   // int64 [rows, codes_width]; `out` is its column codes_column
  int codes_width;
  int codes_column;
};
cudaError_t sample(const SamplingArgs& args, cudaStream_t stream);

// One tensor of a row-indexed copy: row r of dst (or row index[r], scattering) gets row index[r] of src (or
// row r). A row is outer x middle x inner_bytes, the inner bytes contiguous; strides are in bytes (row, outer,
// middle), and `granule` (1, 2, 4, 8 or 16) divides inner_bytes, every stride and both base addresses.
struct RowCopyTask {
  char* dst;
  const char* src;
  int64_t dst_strides[3];
  int64_t src_strides[3];
  int outer;
  int middle;
  int inner_bytes;
  int granule;
};

// Tasks one launch takes: the batch is a kernel parameter, which must stay under 4 KB.
constexpr int kMaxRowCopyTasks = 48;
struct RowCopyBatch {
  RowCopyTask tasks[kMaxRowCopyTasks];
};
static_assert(sizeof(RowCopyBatch) <= 4000, "a kernel's parameters must stay under 4 KB");

// Every task's rows copied for index[0..rows): gathering, dst[r] = src[index[r]]; else dst[index[r]] = src[r]
// (the indices distinct). One launch per kMaxRowCopyTasks tasks.
cudaError_t copy_rows(const RowCopyTask* tasks, int count, const int64_t* index, int rows, bool gather,
                      cudaStream_t stream);

}  // namespace q3tts
