// The talker's input row of a decode step in one kernel, instead of 16 gathers, a stack, a sum and an add.
#include "common.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace q3tts {
namespace {

constexpr int kMaxGroups = 16;  // the model's codebooks

// The table row of `code` (zeros for a code outside the table: the gathers' codes come from the samplers,
// which draw inside the vocabulary, so that case is only a guard).
__device__ __forceinline__ Bf16x8 table_row(const bf16* table, int64_t code, int vocab, int width, int vec) {
  if (code < 0 || code >= vocab) return Bf16x8{};
  return reinterpret_cast<const Bf16x8*>(table + code * width)[vec];
}

// A thread per 8-element vector of a row: every codebook's row loaded first (all in flight at once), then
// summed in fp32 in codebook order, rounded once, and the text row added and rounded again. Row r embeds
// codes row code_rows[r] (row r when code_rows is null): a decode frame reads each slot's last codes in place.
__global__ void frame_embedding_kernel(bf16* __restrict__ out, const int64_t* __restrict__ codes, int code_stride,
                                       const int64_t* __restrict__ code_rows, const bf16* __restrict__ first_table,
                                       int first_vocab, const bf16* __restrict__ tables, int vocab,
                                       const bf16* __restrict__ text, int text_stride, int groups, int width) {
  begin_dependent_kernel();
  const int row = blockIdx.y;
  const int vec = blockIdx.x * blockDim.x + threadIdx.x;
  if (vec * 8 >= width) return;
  const int64_t code_row = code_rows == nullptr ? row : code_rows[row];
  const int64_t* row_codes = codes + code_row * code_stride;
  Bf16x8 parts[kMaxGroups];
  parts[0] = table_row(first_table, row_codes[0], first_vocab, width, vec);
#pragma unroll
  for (int j = 1; j < kMaxGroups; ++j) {
    const bf16* table = tables + static_cast<int64_t>(j - 1) * vocab * width;
    parts[j] = j < groups ? table_row(table, row_codes[j], vocab, width, vec) : Bf16x8{};
  }
  float sum[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) sum[e] = to_f(parts[0].v[e]);
#pragma unroll
  for (int j = 1; j < kMaxGroups; ++j) {
    if (j >= groups) break;
#pragma unroll
    for (int e = 0; e < 8; ++e) sum[e] += to_f(parts[j].v[e]);
  }
  const Bf16x8 t = reinterpret_cast<const Bf16x8*>(text + static_cast<int64_t>(row) * text_stride)[vec];
  Bf16x8 o;
#pragma unroll
  for (int e = 0; e < 8; ++e) o.v[e] = to_bf(round_bf(sum[e]) + to_f(t.v[e]));
  reinterpret_cast<Bf16x8*>(out + static_cast<int64_t>(row) * width)[vec] = o;
}

}  // namespace

cudaError_t frame_embedding(void* out, const int64_t* codes, int code_stride, const int64_t* code_rows,
                            const void* first_table, int first_vocab, const void* tables, int vocab, const void* text,
                            int text_stride, int rows, int groups, int width, cudaStream_t stream) {
  if (width % 8 != 0 || text_stride % 8 != 0 || groups < 1 || groups > kMaxGroups) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const int threads = 128;
  const dim3 grid((width / 8 + threads - 1) / threads, rows);
  launch_kernel(frame_embedding_kernel, grid, dim3(threads), stream, static_cast<bf16*>(out), codes, code_stride,
                code_rows, static_cast<const bf16*>(first_table), first_vocab, static_cast<const bf16*>(tables), vocab,
                static_cast<const bf16*>(text), text_stride, groups, width);
  return cudaGetLastError();
}

}  // namespace q3tts
