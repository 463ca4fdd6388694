// The talker's input row of a decode step in one kernel, instead of 16 gathers, a stack, a sum and an add.
#include "common.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace q3tts {
namespace {

constexpr int kMaxGroups = 16;  // the model's codebooks
constexpr int kThreads = 128;

// A thread per 8-element vector of a row: every codebook's code loaded first, then every table row and the
// text row copied into shared memory asynchronously (all in flight at once: as register loads, ptxas issued
// them one after another into the same registers, each waiting for the previous row's adds), then summed in fp32 in
// codebook order, rounded once, and the text row added and rounded again. A code outside its table (only a
// guard: the samplers draw inside the vocabulary) copies row 0 and reads as zeros. Row r embeds codes row
// code_rows[r] (row r when code_rows is null): a decode frame reads each slot's last codes in place.
__global__ void __launch_bounds__(kThreads)
    frame_embedding_kernel(bf16* __restrict__ out, const int64_t* __restrict__ codes, int code_stride,
                           const int64_t* __restrict__ code_rows, const bf16* __restrict__ first_table,
                           int first_vocab, const bf16* __restrict__ tables, int vocab, const bf16* __restrict__ text,
                           int text_stride, int groups, int width) {
  __shared__ Bf16x8 staged[kMaxGroups + 1][kThreads];  // the codebooks' rows, then the text row
  const int row = blockIdx.y;
  const int vec = blockIdx.x * blockDim.x + threadIdx.x;
  // The code row is an index input (the slots), loaded before the wait (launch.cuh): only the codes' and the
  // tables' loads follow it.
  const int64_t code_row = code_rows == nullptr ? row : load_before_wait(code_rows + row);
  begin_dependent_kernel();
  if (vec * 8 >= width) return;
  const int64_t* row_codes = codes + code_row * code_stride;
  int64_t code[kMaxGroups];
#pragma unroll
  for (int j = 0; j < kMaxGroups; ++j) code[j] = j < groups ? row_codes[j] : 0;
  bool inside[kMaxGroups];
#pragma unroll
  for (int j = 0; j < kMaxGroups; ++j) {
    const bool first = j == 0 || j >= groups;  // the codebooks past `groups` copy (and drop) the first's row 0
    const bf16* table = first ? first_table : tables + static_cast<int64_t>(j - 1) * vocab * width;
    inside[j] = j < groups && code[j] >= 0 && code[j] < (first ? first_vocab : vocab);
    copy_async_16(&staged[j][threadIdx.x], table + (inside[j] ? code[j] : 0) * width + vec * 8);
  }
  copy_async_16(&staged[kMaxGroups][threadIdx.x], text + static_cast<int64_t>(row) * text_stride + vec * 8);
  wait_async_copies();
  float sum[8];
  const Bf16x8 first_row = staged[0][threadIdx.x];
#pragma unroll
  for (int e = 0; e < 8; ++e) sum[e] = inside[0] ? to_f(first_row.v[e]) : 0.0f;
#pragma unroll
  for (int j = 1; j < kMaxGroups; ++j) {
    const Bf16x8 table_row = staged[j][threadIdx.x];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float added = sum[e] + (inside[j] ? to_f(table_row.v[e]) : 0.0f);
      sum[e] = j < groups ? added : sum[e];
    }
  }
  const Bf16x8 t = staged[kMaxGroups][threadIdx.x];
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
  const int threads = kThreads;
  const dim3 grid((width / 8 + threads - 1) / threads, rows);
  launch_kernel(frame_embedding_kernel, grid, dim3(threads), stream, static_cast<bf16*>(out), codes, code_stride,
                code_rows, static_cast<const bf16*>(first_table), first_vocab, static_cast<const bf16*>(tables), vocab,
                static_cast<const bf16*>(text), text_stride, groups, width);
  return cudaGetLastError();
}

}  // namespace q3tts
