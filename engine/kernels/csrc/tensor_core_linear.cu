// Tensor-core products for decode batches of 4 to 128 rows: y[n, m] = x[n, k] @ W[m, k]^T (* per-row scale)
// (+ bias), or SiLU(x @ gate^T) * (x @ up^T) of a fused [gate; up] weight, with bf16 or fp8 (e4m3) weights.
//
// Why: from 4 rows on, the frame's products left the GEMV (CUDA cores) for cuBLAS, whose kernels take 5-6 us at
// 64 rows for 2-12 MB of weights (run 95's 64-stream profile: with their split-K reductions and the SwiGLU
// kernels, over half of the frame), start only once the kernel before them has ended (no programmatic
// dependent launch), and read bf16 weights in fast mode too. Here:
// - a block owns 64 output rows (4 mma.m16n8k16 row tiles of 16, two warps each, one per half of the block's k;
//   for SwiGLU 32 gate rows and their 32 up rows) and a slice of k. The `splits` blocks that share a tile form a
//   thread block cluster and add their partial sums through distributed shared memory, in rank order: no
//   workspace, no second kernel;
// - the block copies its weight slice to shared memory (cp.async) before it waits for the previous kernel
//   (weights are never written), then its activation slice, so both stream in at once with nothing held in
//   registers; the eight warps then read their fragments from shared memory. Where no plan fits one wave with
//   whole slices (the talker's gate/up, 25 MB of fp8 weights), products of up to 8 rows send the slice through
//   a ring of kRing stage buffers instead, filled by bulk copies (TMA, a row an instruction) that stream while
//   a stage is multiplied (`plan` says where stages won and lost);
// - the mma's k index is permuted so that a lane's 16-byte chunk of a weight row holds exactly the k values of
//   its A fragments, and the activations are read with the same permutation (a dot product does not depend on
//   the order of its terms): one 16-byte shared load per row and k-chunk, no ldmatrix, no swizzle;
// - fp8 codes become bf16 exactly in registers (every e4m3 value is a bf16), and the channel scale multiplies
//   the fp32 sum, so the product is the GEMV's: the fp32 sum of code x activation, scaled, rounded once.
// Measured (run 98): frames of 4 and 16 streams 10-21% shorter than on cuBLAS, of 64 streams 24-27% longer, so the
// engine uses it up to 32 rows (`Mode.tensor_core_max_rows`). Run 100 (ncu, each kernel alone): at 64 and 128 rows a
// call takes 9-22 us against cuBLAS's 5.3-8.8, at 4-13% warp occupancy and ~1 cycle of stall per issue: one or two
// blocks of 4 warps an SM ran their copy, product and reduction phases one after the other with nothing to hide
// their latencies (two row tiles a warp, 128 weight rows a block and half the blocks, was slower still); hence
// two warps a row tile.
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "common.cuh"
#include "launch.cuh"
#include "launchers.h"
#include "weight_load.cuh"

namespace q3tts {
namespace {

namespace cg = cooperative_groups;

constexpr int kRowTiles = 4;                       // mma row tiles of a block
constexpr int kWarpRows = 16;                      // output rows of a row tile: the mma's M
constexpr int kTileRows = kRowTiles * kWarpRows;   // output rows of a block
constexpr int kWarps = 2 * kRowTiles;              // two warps a row tile, each with half of the slice's k
constexpr int kMaxRows = 128;                  // activation rows (8 per mma N tile, up to 16 tiles)
constexpr int kSliceAlign = 64;                // a block's k slice is a multiple of this (128 bytes of activations)
constexpr int kMaxSplits = 8;                  // blocks of a cluster (the portable maximum)
constexpr int kRing = 3;                       // stage buffers of a block: the stages in flight at once

// What one 16-byte weight chunk of a lane covers: kChunk consecutive k values, kSteps mma k-steps of 4 each.
template <WeightKind K>
struct ChunkShape {
  static constexpr int kChunk = K == WeightKind::kBf16 ? 8 : 16;
  static constexpr int kSteps = kChunk / 4;
  static constexpr int kBytes = K == WeightKind::kBf16 ? 2 : 1;  // a weight element
};

// Row pitches in shared memory, in bytes: the 8 lanes of a 16-byte shared-load phase read rows g and g + 1 at
// lane columns t = 0..3, `column` bytes apart, so the rows sit 64 bytes apart mod 128 for 16-byte columns and 16
// bytes apart for 32-byte ones: distinct banks.
__host__ __device__ constexpr int pitch(int row_bytes, int column) {
  const int target = column == 16 ? 64 : 16;
  return row_bytes + ((target - row_bytes % 128) + 128) % 128;
}

// The layout of a block's shared memory: up to kRing stage buffers, each the stage's weights [kTileRows, k_stage]
// (weight elements) then its activations [row_tiles * 8, k_stage] bf16; after the products the block's partial
// sums [kTileRows, row_tiles * 8 + 4] fp32 take the place of the first buffers. Past both, a copy barrier a buffer.
struct SharedLayout {
  int weight_pitch, slice_pitch, slice_offset, stage_bytes, barrier_offset, bytes;
  __host__ __device__ SharedLayout(int row_tiles, int k_slice, int k_stage, int weight_bytes) {
    const int column = weight_bytes == 2 ? 16 : 32;  // bytes of activations a lane reads per chunk
    weight_pitch = pitch(k_stage * weight_bytes, 16);
    slice_pitch = pitch(k_stage * 2, column);
    slice_offset = kTileRows * weight_pitch;
    stage_bytes = slice_offset + row_tiles * 8 * slice_pitch;
    const int stages = k_slice / k_stage;
    const int operands = (stages < kRing ? stages : kRing) * stage_bytes;
    const int sums = kTileRows * (row_tiles * 8 + 4) * 4;
    barrier_offset = ((operands > sums ? operands : sums) + 7) / 8 * 8;
    bytes = barrier_offset + kRing * 8;
  }
};

__device__ __forceinline__ void load_words(uint32_t (&out)[4], const unsigned char* p) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
}

// Two e4m3 codes (the low byte first) as a bf16x2 word: exact, every e4m3 value is a bf16.
__device__ __forceinline__ uint32_t fp8x2_as_bf16x2(uint32_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair & 0xFFFFu), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// The A fragment of k-step s from the lane's chunks of rows g and g + 8 (m16n8k16 .row: a0 = row g, logical k
// 2t, 2t+1; a1 = row g+8, same k; a2 = row g, k 2t+8, 2t+9; a3 = row g+8, same k). Logical k (2t, 2t+1) is the
// chunk's elements 4s, 4s+1 and (2t+8, 2t+9) its elements 4s+2, 4s+3.
template <WeightKind K>
__device__ __forceinline__ void a_fragment(uint32_t (&a)[4], const uint32_t (&row_g)[4], const uint32_t (&row_g8)[4],
                                           int s) {
  if constexpr (K == WeightKind::kBf16) {
    a[0] = row_g[2 * s];
    a[1] = row_g8[2 * s];
    a[2] = row_g[2 * s + 1];
    a[3] = row_g8[2 * s + 1];
  } else {
    a[0] = fp8x2_as_bf16x2(row_g[s]);
    a[1] = fp8x2_as_bf16x2(row_g8[s]);
    a[2] = fp8x2_as_bf16x2(row_g[s] >> 16);
    a[3] = fp8x2_as_bf16x2(row_g8[s] >> 16);
  }
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// kBuffers: 1 when the block's whole slice is one stage (its copies all in flight at once), else kRing.
template <WeightKind K, int NT, bool kSwiglu, int kBuffers>
__global__ void __launch_bounds__(kWarps * 32)
    tensor_core_linear_kernel(bf16* __restrict__ y, const bf16* __restrict__ x, const uint8_t* __restrict__ w,
                              const float* __restrict__ scale, const bf16* __restrict__ bias, int n, int k, int m,
                              int x_stride, int y_stride, int k_slice, int k_stage) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using Shape = ChunkShape<K>;
  constexpr int kRoundK = 4 * Shape::kChunk;  // k values a round of the warp's 4 lane columns covers
  constexpr int kSumStride = NT * 8 + 4;
  constexpr int kOutputs = kSwiglu ? kTileRows / 2 : kTileRows;  // output columns of y a block finishes
  extern __shared__ __align__(16) unsigned char shared[];
  cg::cluster_group cluster = cg::this_cluster();
  const int splits = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const SharedLayout layout(NT, k_slice, k_stage, Shape::kBytes);
  constexpr bool kStaged = kBuffers > 1;
  const int stages = kStaged ? k_slice / k_stage : 1;
  const int buffers = stages < kBuffers ? stages : kBuffers;
  const int64_t row_bytes = static_cast<int64_t>(k) * Shape::kBytes;
  const int x_rows = n < NT * 8 ? n : NT * 8;  // activation rows copied; the tiles' other rows are zeros
  const int weight_vecs = k_stage * Shape::kBytes / 16, x_vecs = k_stage / 8;  // 16-byte chunks of a row's stage
  const uint32_t stage_copy_bytes = (kTileRows * weight_vecs + x_rows * x_vecs) * 16;  // a staged barrier's phase
  uint64_t* const barriers = reinterpret_cast<uint64_t*>(shared + layout.barrier_offset);

  // Stage s covers k = rank * k_slice + s * k_stage and the next k_stage values of the block's weight rows (64
  // consecutive, or for SwiGLU 32 gate rows then their up rows, m rows further) and of every activation row; it
  // lands in buffer s % kBuffers. `copy_rows` copies `rows` rows of `vecs` chunks, row r from source(r):
  // - whole slices: 16-byte cp.async copies, a row's address worked out once for all its chunks (run 106: ~15
  //   address instructions a copy when each copy divided its index into row and chunk);
  // - in stages: a bulk copy a row (TMA: one instruction, no per-thread addresses), row r issued by warp
  //   r % kWarps, counted on the buffer's barrier, which completes a phase when all the stage's bytes are there.
  //   Run 107: the talker's gate/up at 4 fp8 rows 12.7 -> 11.1 us; whole slices took 0.1-0.5 us more at 4 rows
  //   with bulk copies (a barrier to set up and fewer copies in flight at once).
  auto buffer_of = [&](int stage) { return kStaged ? shared + (stage % kBuffers) * layout.stage_bytes : shared; };
  auto copy_rows = [&](unsigned char* destination, int row_pitch, int rows, int vecs, auto&& source, int stage) {
    if constexpr (kStaged) {
      for (int r = warp + kWarps * lane; r < rows; r += kWarps * 32) {
        copy_bulk(destination + r * row_pitch, source(r), vecs * 16, barriers + stage % kBuffers);
      }
    } else {
      // A warp copies pass_rows rows at once, row_lanes lanes a row, each lane every row_lanes-th chunk.
      const int row_lanes = vecs < 32 ? vecs : 32, pass_rows = 32 / row_lanes;
      const int lane_row = lane / row_lanes, lane_column = lane - lane_row * row_lanes;
      if (lane_row >= pass_rows) return;
      for (int r = warp * pass_rows + lane_row; r < rows; r += kWarps * pass_rows) {
        const unsigned char* from = source(r) + lane_column * 16;
        unsigned char* to = destination + r * row_pitch + lane_column * 16;
#pragma unroll 4
        for (int c = lane_column; c < vecs; c += row_lanes) {
          copy_async_16(to, from);
          from += row_lanes * 16;
          to += row_lanes * 16;
        }
      }
    }
  };
  auto copy_weights = [&](int stage) {
    const uint8_t* first = w + (static_cast<int64_t>(rank) * k_slice + stage * k_stage) * Shape::kBytes;
    copy_rows(buffer_of(stage), layout.weight_pitch, kTileRows, weight_vecs, [&](int r) {
      const int row = kSwiglu ? (r < kOutputs ? blockIdx.x * kOutputs + r : m + blockIdx.x * kOutputs + r - kOutputs)
                              : blockIdx.x * kTileRows + r;
      return first + row * row_bytes;
    }, stage);
  };
  auto copy_activations = [&](int stage) {
    const unsigned char* first = reinterpret_cast<const unsigned char*>(x + rank * k_slice + stage * k_stage);
    copy_rows(buffer_of(stage) + layout.slice_offset, layout.slice_pitch, x_rows, x_vecs,
              [&](int r) { return first + static_cast<int64_t>(r) * x_stride * 2; }, stage);
  };
  // Rows past n are zeros, stored once in each buffer: no copy writes them.
  auto zero_missing_rows = [&] {
    const int missing = NT * 8 - x_rows;
    for (int r = warp; r < buffers * missing; r += kWarps) {
      const int buffer = r / missing, row = x_rows + r - buffer * missing;
      unsigned char* to = shared + buffer * layout.stage_bytes + layout.slice_offset + row * layout.slice_pitch;
      for (int c = lane; c < x_vecs; c += 32) *reinterpret_cast<uint4*>(to + c * 16) = make_uint4(0, 0, 0, 0);
    }
  };

  // The first buffers' weights stream in before the wait (weights are never written), their activations after
  // it. In stages, thread 0 first sets up the buffers' barriers with their first phases' bytes.
  allow_next_kernel();
  if constexpr (kStaged) {
    zero_missing_rows();
    if (threadIdx.x == 0) {
      for (int stage = 0; stage < buffers; ++stage) {
        init_copy_barrier(barriers + stage);
        expect_copy_bytes(barriers + stage, stage_copy_bytes);
      }
    }
    __syncthreads();
  }
  for (int stage = 0; stage < buffers; ++stage) copy_weights(stage);
  if constexpr (!kStaged) zero_missing_rows();
  wait_for_previous_kernel();
  for (int stage = 0; stage < buffers; ++stage) copy_activations(stage);

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  // Lane (g, t) reads the chunk at k = round * kRoundK + t * kChunk of its weight rows g and g + 8 and of
  // activation rows 8j + g: the B fragment (m16n8k16 .col: b0 = logical k 2t, 2t+1 of column g; b1 = k 2t+8, 2t+9)
  // of k-step s is that chunk's elements 4s..4s+3, as the A fragment's are.
  // Warp w takes row tile w % kRowTiles over the first half of each stage's rounds (w < kRowTiles) or over the
  // rest: two warps a row tile, because one warp a scheduler could not hide its own latencies (run 100).
  const int row_tile = warp % kRowTiles, half = warp / kRowTiles;
  const int weight_lane = (row_tile * kWarpRows + g) * layout.weight_pitch + t * 16;
  const int slice_lane = layout.slice_offset + g * layout.slice_pitch + t * Shape::kChunk * 2;
  const int rounds = k_stage / kRoundK;
  const int first_rounds = (rounds + 1) / 2;
  const int round_begin = half == 0 ? 0 : first_rounds, round_end = half == 0 ? first_rounds : rounds;
  for (int stage = 0; stage < stages; ++stage) {
    if constexpr (kStaged) {
      wait_copy_barrier(barriers + stage % kBuffers, (stage / kBuffers) & 1);
    } else {
      wait_async_copies();  // this thread's copies have landed
      __syncthreads();      // and every thread's
    }
    const unsigned char* buffer = buffer_of(stage);
    const unsigned char* weight_g = buffer + weight_lane;
    const unsigned char* weight_g8 = weight_g + 8 * layout.weight_pitch;
#pragma unroll 2
    for (int round = round_begin; round < round_end; ++round) {
      uint32_t row_g[4], row_g8[4];
      load_words(row_g, weight_g + round * 64);
      load_words(row_g8, weight_g8 + round * 64);
      uint32_t a[Shape::kSteps][4];
#pragma unroll
      for (int s = 0; s < Shape::kSteps; ++s) a_fragment<K>(a[s], row_g, row_g8, s);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const unsigned char* xv = buffer + slice_lane + j * 8 * layout.slice_pitch + round * kRoundK * 2;
        uint32_t b[2 * Shape::kSteps];
#pragma unroll
        for (int h = 0; h < Shape::kSteps / 2; ++h) {
          const uint4 v = reinterpret_cast<const uint4*>(xv)[h];
          b[4 * h] = v.x;
          b[4 * h + 1] = v.y;
          b[4 * h + 2] = v.z;
          b[4 * h + 3] = v.w;
        }
#pragma unroll
        for (int s = 0; s < Shape::kSteps; ++s) mma_bf16(acc[j], a[s], b[2 * s], b[2 * s + 1]);
      }
    }
    if constexpr (kStaged) {
      if (stage + kBuffers < stages) {
        // Thread 0 has seen the buffer's phase end: its arrival opens the next one.
        if (threadIdx.x == 0) expect_copy_bytes(barriers + stage % kBuffers, stage_copy_bytes);
        __syncthreads();  // every warp is done with the buffer before it is refilled
        copy_weights(stage + kBuffers);
        copy_activations(stage + kBuffers);
      }
    }
  }

  // The block's partial sums (c0, c1: row g, columns 2t, 2t+1; c2, c3: row g + 8) where the operands were: the
  // second half's warps store theirs, then the first half's add their own to them (first + second, always).
  __syncthreads();
  float* sums = reinterpret_cast<float*>(shared);
  const int local = row_tile * kWarpRows + g;
  if (half == 1) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      *reinterpret_cast<float2*>(sums + local * kSumStride + 8 * j + 2 * t) = make_float2(acc[j][0], acc[j][1]);
      *reinterpret_cast<float2*>(sums + (local + 8) * kSumStride + 8 * j + 2 * t) =
          make_float2(acc[j][2], acc[j][3]);
    }
  }
  __syncthreads();
  if (half == 0) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      float2* upper = reinterpret_cast<float2*>(sums + local * kSumStride + 8 * j + 2 * t);
      float2* lower = reinterpret_cast<float2*>(sums + (local + 8) * kSumStride + 8 * j + 2 * t);
      const float2 u = *upper, l = *lower;
      *upper = make_float2(acc[j][0] + u.x, acc[j][1] + u.y);
      *lower = make_float2(acc[j][2] + l.x, acc[j][3] + l.y);
    }
  }
  if (splits > 1) {
    cluster.sync();
  } else {
    __syncthreads();
  }
  // Block `rank` finishes its share of the tile's outputs, 4 activation rows at a time (one 16-byte load of each
  // rank's sums, all the ranks' loads issued before the first add), adding the partial sums in rank order.
  const float4* parts[kMaxSplits];
#pragma unroll
  for (int q = 0; q < kMaxSplits; ++q) {
    const float* part = q < splits && splits > 1 ? cluster.map_shared_rank(sums, q) : sums;
    parts[q] = reinterpret_cast<const float4*>(part);
  }
  const int share = kOutputs / splits;
  const int quads = (n + 3) / 4;
  for (int i = threadIdx.x; i < share * quads; i += kWarps * 32) {
    const int quad = i / share;
    const int out = rank * share + (i - quad * share);  // the output within the tile
    float4 firsts[kMaxSplits], seconds[kMaxSplits];
#pragma unroll
    for (int q = 0; q < kMaxSplits; ++q) {
      if (q < splits) {
        firsts[q] = parts[q][(out * kSumStride) / 4 + quad];
        if constexpr (kSwiglu) seconds[q] = parts[q][((out + kOutputs) * kSumStride) / 4 + quad];
      }
    }
    float first[4] = {0.0f, 0.0f, 0.0f, 0.0f}, second[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int q = 0; q < kMaxSplits; ++q) {
      if (q < splits) {
        first[0] += firsts[q].x;
        first[1] += firsts[q].y;
        first[2] += firsts[q].z;
        first[3] += firsts[q].w;
        if constexpr (kSwiglu) {
          second[0] += seconds[q].x;
          second[1] += seconds[q].y;
          second[2] += seconds[q].z;
          second[3] += seconds[q].w;
        }
      }
    }
    const int column = blockIdx.x * kOutputs + out;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = 4 * quad + e;
      if (r >= n) break;
      y[static_cast<int64_t>(r) * y_stride + column] =
          kSwiglu ? swiglu_of(scaled(first[e], scale, nullptr, column), scaled(second[e], scale, nullptr, m + column))
                  : scaled(first[e], scale, bias, column);
    }
  }
  if (splits > 1) cluster.sync();  // no block leaves while another reads its sums
#endif
}

int device_attribute(cudaDeviceAttr attribute) {
  int device = 0, value = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&value, attribute, device) != cudaSuccess) {
    return 0;
  }
  return value;
}

// How many blocks of `kernel` in clusters of `splits` blocks with `bytes` of shared memory each can be resident on
// the device at once: a cluster's blocks must share a GPC, so the count of whole clusters that fit (the runtime's
// answer) is below the per-SM occupancy times the SMs whenever a GPC's SMs do not divide into clusters.
template <typename Kernel>
int resident_blocks(Kernel kernel, int splits, int bytes, int sm_count) {
  if (splits == 1) {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarps * 32, bytes) != cudaSuccess) return 0;
    return per_sm * sm_count;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(1, splits);
  config.blockDim = dim3(kWarps * 32);
  config.dynamicSmemBytes = bytes;
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 1;
  cluster.val.clusterDim.y = splits;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) return 0;
  return clusters * splits;
}

// Activation rows in mma column tiles of 8, as the kernel is instantiated: 1, 2, 4, 8 or 16 tiles.
int row_tiles(int n) { return n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : n <= 64 ? 8 : 16; }

// How a product is launched: its tiles' k split over `splits` blocks (0: the kernel does not take it), each
// block's slice multiplied in stages of `stage` k values, with `bytes` of shared memory a block.
struct Plan {
  int tiles = 0, splits = 0, stage = 0, bytes = 0;
};

// Whether a product of these weights and activation column tiles may run in stages: only where stages won, one
// column tile (up to 8 rows). Run 103 (cp.async stages, each product alone, weights cold, against cuBLAS and its
// SiLU * up): the talker's gate/up 12.8 against 17.9 us at 4 fp8 rows, but 16.0 against 18.1 at 16 fp8 rows, 34
// against 18.8 at 64, 20.8 against 18.1 at 16 bf16 rows, and the frame replays of 16 and 32 streams lost with
// them. Run 107 (bulk-copy stages): at 4 rows the gate/up 11.1 (fp8) and 15.2 us (bf16, cuBLAS 17.8), the bf16
// down 10.7 (cuBLAS 11.8); exact frames of 4 and 8 streams 0.8 and 1.1% shorter with the bf16 ones. Only these
// instantiations of the staged kernel are compiled.
template <int NT>
constexpr bool kStagesWin = NT == 1;

// The fewest splits (a power of two up to kMaxSplits, slices a multiple of kSliceAlign) that give the launch a
// block per SM, among those whose blocks all fit on the device at once: a second wave of blocks would wait for
// the first one's latency. Without such a split, the largest that fits in one wave. Whole slices first (each
// block's copies all in flight at once, nothing to pipeline: the plans runs 98-101 measured); where no split
// fits one wave whole (the talker's gate/up, its bf16 down) and stages win (kStagesWin), slices in stages, each
// split with its largest stage that fits (a half, a quarter... of the slice, a round at least; kRing of them in
// flight). None at all: the kernel does not take the product (cuBLAS does). A function of the shapes and the
// device.
template <WeightKind K, int NT, bool kSwiglu>
Plan plan(int k, int m) {
  constexpr int kRoundK = 4 * ChunkShape<K>::kChunk;
  const int tiles = kSwiglu ? m / (kTileRows / 2) : m / kTileRows;
  const int sm_count = device_attribute(cudaDevAttrMultiProcessorCount);
  const int max_shared = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  // Every launch may take up to the device's limit (graphs captured earlier keep launches of any size valid).
  auto allow_max_shared = [&](auto kernel) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_shared) == cudaSuccess;
  };
  // The plan of `splits` blocks a tile, each slice in `stages` stages of `kernel`, if its blocks fit one wave
  // (else splits 0).
  auto fitting = [&](auto kernel, int splits, int stages) {
    const int k_slice = k / splits;
    const int bytes = SharedLayout(NT, k_slice, k_slice / stages, ChunkShape<K>::kBytes).bytes;
    if (bytes > max_shared || tiles * splits > resident_blocks(kernel, splits, bytes, sm_count)) return Plan{};
    return Plan{tiles, splits, k_slice / stages, bytes};
  };
  // The fewest splits whose plan (`of_split(splits)`) gives a block per SM, else the most that have one.
  auto fewest_splits = [&](auto&& of_split) {
    Plan chosen;
    for (int splits = 1; splits <= kMaxSplits && k % (splits * kSliceAlign) == 0; splits *= 2) {
      const Plan p = of_split(splits);
      if (p.splits == 0) continue;
      chosen = p;
      if (tiles * splits >= sm_count) break;
    }
    return chosen;
  };
  auto whole_kernel = tensor_core_linear_kernel<K, NT, kSwiglu, 1>;
  if (!allow_max_shared(whole_kernel)) return Plan{};
  const Plan whole = fewest_splits([&](int splits) { return fitting(whole_kernel, splits, 1); });
  if constexpr (kStagesWin<NT>) {
    auto staged_kernel = tensor_core_linear_kernel<K, NT, kSwiglu, kRing>;
    if (whole.splits == 0 && allow_max_shared(staged_kernel)) {
      return fewest_splits([&](int splits) {
        const int k_slice = k / splits;
        for (int stages = 2; k_slice % stages == 0 && (k_slice / stages) % kRoundK == 0; stages *= 2) {
          const Plan p = fitting(staged_kernel, splits, stages);
          if (p.splits != 0) return p;
        }
        return Plan{};
      });
    }
  }
  return whole;
}

// Calls visit(K, NT, swiglu) as compile-time constants for the instantiated kernels.
template <typename Visit>
auto dispatch(WeightKind kind, int n, bool swiglu, Visit&& visit) {
  auto rows = [&](auto k_kind, auto glu) {
    switch (row_tiles(n)) {
      case 1: return visit(k_kind, std::integral_constant<int, 1>{}, glu);
      case 2: return visit(k_kind, std::integral_constant<int, 2>{}, glu);
      case 4: return visit(k_kind, std::integral_constant<int, 4>{}, glu);
      case 8: return visit(k_kind, std::integral_constant<int, 8>{}, glu);
      default: return visit(k_kind, std::integral_constant<int, 16>{}, glu);
    }
  };
  auto kinds = [&](auto glu) {
    return kind == WeightKind::kBf16
               ? rows(std::integral_constant<WeightKind, WeightKind::kBf16>{}, glu)
               : rows(std::integral_constant<WeightKind, WeightKind::kFp8E4M3>{}, glu);
  };
  return swiglu ? kinds(std::true_type{}) : kinds(std::false_type{});
}

// `plan` of the instantiation that takes these operands, worked out once per device and shapes (it asks the
// driver about occupancy, too slow for every eager launch).
Plan plan_of(int n, int k, int m, WeightKind kind, bool swiglu) {
  static std::mutex lock;
  static std::map<std::tuple<int, int, int, int, int, bool>, Plan> plans;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return Plan{};
  const auto key = std::make_tuple(device, row_tiles(n), k, m, static_cast<int>(kind), swiglu);
  const std::lock_guard<std::mutex> guard(lock);
  const auto found = plans.find(key);
  if (found != plans.end()) return found->second;
  const Plan made =
      dispatch(kind, n, swiglu, [&](auto k_kind, auto nt, auto glu) { return plan<k_kind, nt, glu>(k, m); });
  plans.emplace(key, made);
  return made;
}

// The plan of a product the kernel takes (a Hopper device, 1 to kMaxRows rows, bf16 or fp8 weights, whole
// tiles and slices, blocks that fit the device at once); an empty plan (splits 0) for any other.
Plan launch_plan(int n, int k, int m, WeightKind kind, bool swiglu) {
  if (device_attribute(cudaDevAttrComputeCapabilityMajor) < 9) return Plan{};
  if (n < 1 || n > kMaxRows || kind == WeightKind::kInt8 || k % kSliceAlign != 0) return Plan{};
  if (m % (swiglu ? kTileRows / 2 : kTileRows) != 0) return Plan{};
  return plan_of(n, k, m, kind, swiglu);
}

}  // namespace

bool tensor_core_linear_supported(int n, int k, int m, WeightKind kind, bool swiglu) {
  return launch_plan(n, k, m, kind, swiglu).splits != 0;
}

cudaError_t tensor_core_linear(void* y, const void* x, const void* w, const float* scale, const void* bias, int n,
                               int k, int m, int x_stride, int y_stride, WeightKind kind, bool swiglu,
                               cudaStream_t stream) {
  const Plan p = launch_plan(n, k, m, kind, swiglu);
  if (p.splits == 0 || x_stride % 8 != 0 || (swiglu && bias != nullptr)) return cudaErrorInvalidValue;
  const int k_slice = k / p.splits;
  return dispatch(kind, n, swiglu, [&](auto k_kind, auto nt, auto glu) {
    auto kernel = tensor_core_linear_kernel<k_kind, nt, glu, 1>;
    if constexpr (kStagesWin<nt>) {
      if (p.stage != k_slice) kernel = tensor_core_linear_kernel<k_kind, nt, glu, kRing>;
    }
    return launch_kernel_clustered(kernel, dim3(p.tiles, p.splits), dim3(kWarps * 32), p.bytes, p.splits, stream,
                                   static_cast<bf16*>(y), static_cast<const bf16*>(x),
                                   static_cast<const uint8_t*>(w), scale, static_cast<const bf16*>(bias), n, k, m,
                                   x_stride, y_stride, k_slice, p.stage);
  });
}

}  // namespace q3tts
