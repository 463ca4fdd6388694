// Row-indexed copies of many tensors in one kernel: the codec graphs' state gather (pool rows picked by slot
// into a batch) and scatter (the batch's updated states back into their pool rows). Done with torch, that is
// one index op per state tensor, ~30 each way a packet, each a full launch gap (torch launches carry no
// dependent launch); here it is one kernel each way. A pure copy: bit-identical by construction.
#include <type_traits>

#include "common.cuh"
#include "launch.cuh"
#include "launchers.h"

namespace q3tts {
namespace {

constexpr int kThreads = 256;

// The type a G-byte granule is copied as.
template <int G>
using GranuleType =
    std::conditional_t<G == 16, uint4,
                       std::conditional_t<G == 8, uint2,
                                          std::conditional_t<G == 4, uint32_t,
                                                             std::conditional_t<G == 2, uint16_t, uint8_t>>>>;

// This block's share (grid-stride over blockIdx.x) of one task: rows x outer x middle x granules of G bytes.
template <int G>
__device__ __forceinline__ void copy_task(const RowCopyTask& t, const int64_t* __restrict__ index, int rows,
                                          bool gather) {
  using T = GranuleType<G>;
  const int64_t inner = t.inner_bytes / G;
  const int64_t per_middle = inner;
  const int64_t per_outer = static_cast<int64_t>(t.middle) * per_middle;
  const int64_t per_row = static_cast<int64_t>(t.outer) * per_outer;
  const int64_t total = per_row * rows;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t r = i / per_row;
    int64_t rest = i - r * per_row;
    const int64_t a = rest / per_outer;
    rest -= a * per_outer;
    const int64_t b = rest / per_middle;
    const int64_t c = rest - b * per_middle;
    const int64_t picked = index[r];
    const int64_t src_row = gather ? picked : r;
    const int64_t dst_row = gather ? r : picked;
    const char* s = t.src + src_row * t.src_strides[0] + a * t.src_strides[1] + b * t.src_strides[2] + c * G;
    char* d = t.dst + dst_row * t.dst_strides[0] + a * t.dst_strides[1] + b * t.dst_strides[2] + c * G;
    *reinterpret_cast<T*>(d) = *reinterpret_cast<const T*>(s);
  }
}

// blockIdx.y picks the task. The batch is a __grid_constant__ parameter, read in place (no per-thread copy).
__global__ void __launch_bounds__(kThreads)
    copy_rows_kernel(const __grid_constant__ RowCopyBatch batch, const int64_t* __restrict__ index, int rows,
                     bool gather) {
  begin_dependent_kernel();
  const RowCopyTask& t = batch.tasks[blockIdx.y];
  switch (t.granule) {
    case 16: copy_task<16>(t, index, rows, gather); break;
    case 8: copy_task<8>(t, index, rows, gather); break;
    case 4: copy_task<4>(t, index, rows, gather); break;
    case 2: copy_task<2>(t, index, rows, gather); break;
    default: copy_task<1>(t, index, rows, gather); break;
  }
}

}  // namespace

cudaError_t copy_rows(const RowCopyTask* tasks, int count, const int64_t* index, int rows, bool gather,
                      cudaStream_t stream) {
  if (count < 0 || rows < 0) return cudaErrorInvalidValue;
  for (int first = 0; first < count && rows > 0; first += kMaxRowCopyTasks) {
    RowCopyBatch batch{};
    const int here = count - first < kMaxRowCopyTasks ? count - first : kMaxRowCopyTasks;
    int64_t largest = 1;
    for (int j = 0; j < here; ++j) {
      const RowCopyTask& t = tasks[first + j];
      const bool valid = t.granule == 1 || t.granule == 2 || t.granule == 4 || t.granule == 8 || t.granule == 16;
      if (!valid || t.inner_bytes % t.granule != 0) return cudaErrorInvalidValue;
      batch.tasks[j] = t;
      const int64_t granules = static_cast<int64_t>(rows) * t.outer * t.middle * (t.inner_bytes / t.granule);
      largest = granules > largest ? granules : largest;
    }
    // About four granules a thread for the largest task, at most two waves of the GPU's worth of blocks.
    const int64_t wanted = (largest + 4 * kThreads - 1) / (4 * kThreads);
    const dim3 grid(static_cast<unsigned>(wanted < 264 ? wanted : 264), here);
    const cudaError_t err = launch_kernel(copy_rows_kernel, grid, dim3(kThreads), stream, batch, index, rows, gather);
    if (err != cudaSuccess) return err;
  }
  return cudaGetLastError();
}

}  // namespace q3tts
