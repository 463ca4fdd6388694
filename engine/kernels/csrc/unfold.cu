// The unfolded input of the codec's convs as GEMMs (codec.py, `conv1d_as_gemm`): out[(c * K + k) * B + b, t] =
// s[b, c, k * dilation + t] over the samples s = [history | x] (a causal conv's left context, then the pass's
// samples), the [C * K, B * T] columns matrix, copied bit for bit; optionally with x's samples through SnakeBeta
// (snake.cuh) as they are read, so the activation before a conv is never written out.
// Why: torch made it as torch.cat then a copy of a permuted unfold view, whose generic kernel computes a 4-D
// index per element and moves 2 or 4 bytes at a time; at 64 streams those copies and concatenations were 9 of
// a 15.5 ms bf16 packet. Here each thread writes 16 bytes of one output row, reading the history or x as the
// sample index says, so the concatenation is never made; long rows are staged in shared memory first, so
// each source sample is read once for the K rows that hold it.
#include "common.cuh"
#include "launch.cuh"
#include "launchers.h"
#include "snake.cuh"

namespace q3tts {
namespace {

template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kElems = 16 / sizeof(T);
  T v[kElems];
};

// The samples of one conv input: `context` history samples, then x's, those of x through SnakeBeta(x + bias)
// when `frequency` is set. Element strides. With `tail`, the samples from `tail_first` on (x's last ones) are
// also written there as read, [B, C, tail_length] contiguous (`keep`).
template <typename T>
struct Samples {
  const T* history;
  const T* x;
  int64_t history_strides[3];
  int64_t x_strides[3];
  int context;
  const T* frequency = nullptr;
  const T* inverse_beta = nullptr;
  const T* bias = nullptr;
  T* tail = nullptr;
  int64_t channels = 0;
  int64_t tail_first = 0;
  int tail_length = 0;

  __device__ __forceinline__ T at(int b, int64_t c, int64_t s) const {
    if (s < context) return history[b * history_strides[0] + c * history_strides[1] + s * history_strides[2]];
    const T v = x[b * x_strides[0] + c * x_strides[1] + (s - context) * x_strides[2]];
    return frequency == nullptr ? v : snake_of_channel(v, frequency, inverse_beta, bias, c);
  }

  // Sample s's value v, from the one thread that reads s for the last tap (k = K - 1: s = span + t, once each).
  __device__ __forceinline__ void keep(int b, int64_t c, int64_t s, T v) const {
    if (tail != nullptr && s >= tail_first) tail[(b * channels + c) * tail_length + (s - tail_first)] = v;
  }
};

// Row r of the output is (c, k, b) = (r / (K * B), r / B % K, r % B).
struct RowIndex {
  int b, k;
  int64_t c;
  __device__ __forceinline__ RowIndex(int64_t row, int batch, int kernel)
      : b(static_cast<int>(row % batch)), k(static_cast<int>(row / batch % kernel)), c(row / batch / kernel) {}
};

// One thread per 16 output bytes; rows are `length` long, a multiple of the vector's elements.
template <typename T>
__global__ void unfold_rows_kernel(T* __restrict__ out, Samples<T> in, int64_t vecs, int batch, int kernel,
                                   int length, int dilation) {
  constexpr int E = Vec16<T>::kElems;
  begin_dependent_kernel();
  const int per_row = length / E;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vecs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / per_row;
    const int t0 = static_cast<int>(i - row * per_row) * E;
    const RowIndex r(row, batch, kernel);
    const int64_t s0 = static_cast<int64_t>(r.k) * dilation + t0;
    Vec16<T> v;
#pragma unroll
    for (int j = 0; j < E; ++j) v.v[j] = in.at(r.b, r.c, s0 + j);
    *reinterpret_cast<Vec16<T>*>(out + row * length + t0) = v;
    if (r.k == kernel - 1) {
#pragma unroll
      for (int j = 0; j < E; ++j) in.keep(r.b, r.c, s0 + j, v.v[j]);
    }
  }
}

// Rows of at least kStagedMinLength samples: a block per (source row (c, b), tile of kTile output samples)
// stages the tile's samples (tile + span of them) in shared memory with one coalesced read each, then writes
// the K output rows' tiles from there, 16 bytes a thread. The per-thread kernel above reads every source
// sample K times, element by element (a tap's run is rarely 16-byte aligned), which left it at ~1 TB/s.
constexpr int kTile = 1024;
constexpr int kStagedMinLength = 64;
constexpr int kStagedThreads = 128;

template <typename T>
__global__ void __launch_bounds__(kStagedThreads)
    unfold_staged_kernel(T* __restrict__ out, Samples<T> in, int batch, int kernel, int length, int dilation) {
  constexpr int E = Vec16<T>::kElems;
  extern __shared__ __align__(16) unsigned char stage_bytes[];
  T* stage = reinterpret_cast<T*>(stage_bytes);
  begin_dependent_kernel();
  const int64_t source_row = blockIdx.x;  // c * batch + b
  const int b = static_cast<int>(source_row % batch);
  const int64_t c = source_row / batch;
  const int t0 = blockIdx.y * kTile;
  const int tile = min(kTile, length - t0);  // a multiple of E: length and kTile are
  const int span = (kernel - 1) * dilation;
  const int staged = tile + span;
  for (int i = threadIdx.x; i < staged; i += blockDim.x) stage[i] = in.at(b, c, static_cast<int64_t>(t0) + i);
  __syncthreads();
  // The tail from the stage, not as each sample is staged: with the global store in that loop the 64-stream
  // bf16 packet took 0.5% longer (run 141; a store that may alias x, for all the compiler knows, keeps the
  // loop's loads from being hoisted). A tile keeps its own samples, t0 + span on; only the last holds tail ones.
  if (in.tail != nullptr) {
    const int64_t first = max(static_cast<int64_t>(span), in.tail_first - t0);
    for (int64_t i = first + threadIdx.x; i < staged; i += blockDim.x) in.keep(b, c, t0 + i, stage[i]);
  }
  const int per_tap = tile / E;
  for (int i = threadIdx.x; i < kernel * per_tap; i += blockDim.x) {
    const int k = i / per_tap, v = i - k * per_tap;
    const T* src = stage + k * dilation + v * E;
    Vec16<T> vec;
#pragma unroll
    for (int j = 0; j < E; ++j) vec.v[j] = src[j];
    T* dst = out + ((c * kernel + k) * batch + b) * static_cast<int64_t>(length) + t0 + v * E;
    *reinterpret_cast<Vec16<T>*>(dst) = vec;
  }
}

// One thread per output element: rows of any length.
template <typename T>
__global__ void unfold_kernel(T* __restrict__ out, Samples<T> in, int64_t total, int batch, int kernel, int length,
                              int dilation) {
  begin_dependent_kernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / length;
    const int t = static_cast<int>(i - row * length);
    const RowIndex r(row, batch, kernel);
    const int64_t s = static_cast<int64_t>(r.k) * dilation + t;
    const T v = in.at(r.b, r.c, s);
    out[i] = v;
    if (r.k == kernel - 1) in.keep(r.b, r.c, s, v);
  }
}

// A conv input's samples as the kernels read them; the tail holds the last tail_length samples of the last tap's
// reads, which end at sample (kernel - 1) * dilation + length.
template <typename T>
Samples<T> samples_of(const UnfoldInput& input, const SnakeParameters* snake, int64_t kernel, int64_t length,
                      int64_t dilation) {
  Samples<T> in{static_cast<const T*>(input.history), static_cast<const T*>(input.x),
                {input.history_strides[0], input.history_strides[1], input.history_strides[2]},
                {input.x_strides[0], input.x_strides[1], input.x_strides[2]}, static_cast<int>(input.context)};
  if (snake != nullptr) {
    in.frequency = static_cast<const T*>(snake->frequency);
    in.inverse_beta = static_cast<const T*>(snake->inverse_beta);
    in.bias = static_cast<const T*>(snake->bias);
    in.tail = static_cast<T*>(snake->tail);
    in.channels = input.channels;
    in.tail_length = static_cast<int>(snake->tail_length);
    in.tail_first = (kernel - 1) * dilation + length - snake->tail_length;
  }
  return in;
}

template <typename T>
cudaError_t launch(void* out, const UnfoldInput& input, const SnakeParameters* snake, int64_t kernel, int64_t length,
                   int64_t dilation, cudaStream_t stream) {
  const int64_t total = input.channels * kernel * input.batch * length;
  if (total == 0) return cudaSuccess;
  const Samples<T> in = samples_of<T>(input, snake, kernel, length, dilation);
  constexpr int kThreads = 256;
  constexpr int E = Vec16<T>::kElems;
  auto grid = [](int64_t work) {  // grid-stride loops: at most 65535 blocks
    const int64_t blocks = (work + kThreads - 1) / kThreads;
    return dim3(static_cast<unsigned>(blocks < 65535 ? blocks : 65535));
  };
  const int b = static_cast<int>(input.batch), k = static_cast<int>(kernel), n = static_cast<int>(length);
  const int d = static_cast<int>(dilation);
  const size_t stage_bytes = (kTile + (kernel - 1) * dilation) * sizeof(T);
  const bool vectors = length % E == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vectors && length >= kStagedMinLength && stage_bytes <= 48 * 1024 &&
      input.batch * input.channels <= INT32_MAX && (length + kTile - 1) / kTile <= 65535) {
    const dim3 tiles(static_cast<unsigned>(input.batch * input.channels),
                     static_cast<unsigned>((length + kTile - 1) / kTile));
    launch_kernel_shared(unfold_staged_kernel<T>, tiles, dim3(kStagedThreads), stage_bytes, stream,
                         static_cast<T*>(out), in, b, k, n, d);
  } else if (vectors) {
    launch_kernel(unfold_rows_kernel<T>, grid(total / E), dim3(kThreads), stream, static_cast<T*>(out), in,
                  total / E, b, k, n, d);
  } else {
    launch_kernel(unfold_kernel<T>, grid(total), dim3(kThreads), stream, static_cast<T*>(out), in, total, b, k, n,
                  d);
  }
  return cudaGetLastError();
}

// The samples [history | x] time-major, out[b * L + s, c] = s[b, c, s] (out contiguous [B * L, C], L = context +
// x's samples), x's through SnakeBeta when set, the tail written as the unfold writes it: the operand of the
// Triton implicit-GEMM conv (triton_conv.py), which loads each tap's columns as whole sample rows. A block
// stages kTimeMajorSamples samples of 4 * E channels of one stream (E = 16 / sizeof(T)) in shared memory, read
// as 16-byte vectors along x's time axis and written out as 16-byte vectors along out's channel axis (64-byte
// rows). x's samples are tiled from x's first (so its vectors are aligned), the history's apart. Why: a 64 x 64
// tile moved 2 or 4 bytes a thread at a time, ~0.9 TB/s (1.33 ms for the 64-stream packet's twelve 7-tap
// convs, run 161, an H100); an E x E block a thread transposed in registers, 100 registers a thread, took 2.44
// (run 162); the 1-tap unfold then torch's transpose before them 4 ms (run 159).
constexpr int kTimeMajorThreads = 256;
constexpr int kTimeMajorSamples = 128;

template <typename T>
__global__ void __launch_bounds__(kTimeMajorThreads)
    time_major_samples_kernel(T* __restrict__ out, Samples<T> in, int channels, int length, int history_tiles,
                              bool vectors) {
  constexpr int E = Vec16<T>::kElems;
  constexpr int kChannels = 4 * E;
  constexpr int kStride = kChannels + E;  // a staged sample's elements: 16-byte aligned rows, padded
  constexpr int kChunks = kTimeMajorSamples / E;
  constexpr int kLoads = kChannels * kChunks / kTimeMajorThreads;
  __shared__ __align__(16) T tile[kTimeMajorSamples * kStride];
  begin_dependent_kernel();
  const int b = blockIdx.z;
  const int c0 = blockIdx.y * kChannels;
  const bool in_history = static_cast<int>(blockIdx.x) < history_tiles;
  const int s0 = in_history ? blockIdx.x * kTimeMajorSamples
                            : in.context + (blockIdx.x - history_tiles) * kTimeMajorSamples;
  const int count = min(kTimeMajorSamples, (in_history ? in.context : length) - s0);
  // A warp's lanes take 32 channels (16 for float) of one chunk: each staged row is then written whole.
  Vec16<T> loaded[kLoads];
#pragma unroll
  for (int n = 0; n < kLoads; ++n) {
    const int v = threadIdx.x + n * kTimeMajorThreads;
    const int c = c0 + v % kChannels, first = v / kChannels * E;
    if (vectors && !in_history && c < channels && first + E <= count) {
      loaded[n] = *reinterpret_cast<const Vec16<T>*>(in.x + b * in.x_strides[0] + c * in.x_strides[1] +
                                                     (s0 - in.context + first));
    }
  }
#pragma unroll
  for (int n = 0; n < kLoads; ++n) {
    const int v = threadIdx.x + n * kTimeMajorThreads;
    const int k = v % kChannels, first = v / kChannels * E;
    if (c0 + k >= channels || first >= count) continue;
    T* staged = tile + first * kStride + k;
    if (vectors && !in_history && first + E <= count) {
#pragma unroll
      for (int j = 0; j < E; ++j) {
        const T value = loaded[n].v[j];
        staged[j * kStride] = in.frequency == nullptr
                                  ? value
                                  : snake_of_channel(value, in.frequency, in.inverse_beta, in.bias, c0 + k);
      }
    } else {
#pragma unroll
      for (int j = 0; j < E; ++j) {
        if (first + j < count) staged[j * kStride] = in.at(b, c0 + k, s0 + first + j);
      }
    }
  }
  __syncthreads();
  // The tail from the tile, after the reads (unfold_staged_kernel says why).
  if (in.tail != nullptr && s0 + count > in.tail_first) {
    for (int v = threadIdx.x; v < kTimeMajorSamples * kChannels; v += kTimeMajorThreads) {
      const int i = v / kChannels, k = v % kChannels;
      if (i < count && c0 + k < channels) in.keep(b, c0 + k, s0 + i, tile[i * kStride + k]);
    }
  }
  T* rows = out + (static_cast<int64_t>(b) * length + s0) * channels + c0;
  for (int u = threadIdx.x; u < kTimeMajorSamples * 4; u += kTimeMajorThreads) {
    const int i = u / 4, first = u % 4 * E;
    if (i >= count || c0 + first >= channels) continue;
    const T* staged = tile + i * kStride + first;
    T* row = rows + static_cast<int64_t>(i) * channels + first;
    if (vectors) {
      *reinterpret_cast<Vec16<T>*>(row) = *reinterpret_cast<const Vec16<T>*>(staged);
    } else {
      for (int k = 0; k < E && c0 + first + k < channels; ++k) row[k] = staged[k];
    }
  }
}

template <typename T>
cudaError_t launch_time_major(void* out, const UnfoldInput& input, const SnakeParameters* snake, int64_t length,
                              cudaStream_t stream) {
  if (input.batch * input.channels * length == 0) return cudaSuccess;
  constexpr int E = Vec16<T>::kElems;
  const Samples<T> in = samples_of<T>(input, snake, 1, length, 1);
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  // 16-byte vectors: x's rows along time from aligned addresses, out's rows a whole number of vectors.
  const bool vectors = input.x_strides[2] == 1 && input.x_strides[0] % E == 0 && input.x_strides[1] % E == 0 &&
                       input.channels % E == 0 && aligned(input.x) && aligned(out);
  const int64_t history_tiles = (input.context + kTimeMajorSamples - 1) / kTimeMajorSamples;
  const int64_t x_tiles = (length - input.context + kTimeMajorSamples - 1) / kTimeMajorSamples;
  const dim3 blocks(static_cast<unsigned>(history_tiles + x_tiles),
                    static_cast<unsigned>((input.channels + 4 * E - 1) / (4 * E)), static_cast<unsigned>(input.batch));
  launch_kernel(time_major_samples_kernel<T>, blocks, dim3(kTimeMajorThreads), stream, static_cast<T*>(out), in,
                static_cast<int>(input.channels), static_cast<int>(length), static_cast<int>(history_tiles),
                vectors);
  return cudaGetLastError();
}

// The codec's last conv (C channels to the one waveform channel) convolved directly from the same samples: as a
// GEMM it unfolds its input K times over to feed a single output row (at 64 streams a 660 MB bf16 copy and a
// GEMV over it, for 94 MB of input). A block is kConvOutputs * 32 outputs of one stream by 16 warps: lane l
// holds outputs l, l + 32, ... (so a warp's sample loads are consecutive), warp w sums channels w, w + 16, ...;
// the 16 partial sums are added in warp order, so the result does not depend on the batch. Each output's sum
// runs over its warp's channels, then taps, in order. With one output a lane, 8 warps and a runtime tap count
// a lane kept one load in flight: 0.53 ms for the 64-stream bf16 packet's conv (~210 GB/s, run 63); 4 outputs
// a lane and 8 warps fixed that at 64 streams but left 60 blocks of 12 serial channel rounds for one stream's
// 4-frame packet (34 us, run 67). Now the codec's 7 taps are unrolled, two channels a round: 28 loads in flight
// a lane, 3 rounds a warp for the codec's 96 channels.
constexpr int kConvWarps = 16;
constexpr int kConvOutputs = 2;

// kTaps > 0: the tap count, unrolled; 0: `kernel` taps at run time.
template <typename T, int kTaps>
__global__ void __launch_bounds__(32 * kConvWarps)
    conv_to_one_channel_kernel(T* __restrict__ out, Samples<T> in, const T* __restrict__ weight,
                               const T* __restrict__ bias, int channels, int kernel, int dilation, int length) {
  __shared__ float partial[kConvWarps][kConvOutputs * 32];
  begin_dependent_kernel();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = blockIdx.y;
  const int block_first = blockIdx.x * (kConvOutputs * 32);
  const int first = block_first + lane;
  const int taps = kTaps > 0 ? kTaps : kernel;
  // Past the history with unit-stride samples (every block but the first, as the codec lays them out), a
  // sample is a fixed offset from one pointer a row.
  const bool contiguous_x = block_first >= in.context && in.x_strides[2] == 1;
  float acc[kConvOutputs];
#pragma unroll
  for (int j = 0; j < kConvOutputs; ++j) acc[j] = 0.0f;
#pragma unroll 2
  for (int c = warp; c < channels; c += kConvWarps) {
    const T* w = weight + static_cast<int64_t>(c) * taps;
    if (contiguous_x) {
      const T* x = in.x + b * in.x_strides[0] + c * in.x_strides[1] + (first - in.context);
#pragma unroll
      for (int k = 0; k < taps; ++k) {
        const float wk = to_float(w[k]);
#pragma unroll
        for (int j = 0; j < kConvOutputs; ++j) {
          if (first + 32 * j < length) acc[j] = fmaf(wk, to_float(x[k * dilation + 32 * j]), acc[j]);
        }
      }
    } else {
#pragma unroll 1
      for (int k = 0; k < taps; ++k) {
        const float wk = to_float(w[k]);
#pragma unroll
        for (int j = 0; j < kConvOutputs; ++j) {
          const int t = first + 32 * j;
          if (t < length) acc[j] = fmaf(wk, to_float(in.at(b, c, static_cast<int64_t>(k) * dilation + t)), acc[j]);
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kConvOutputs; ++j) partial[warp][lane + 32 * j] = acc[j];
  __syncthreads();
  if (warp < kConvOutputs) {
    const int t = block_first + warp * 32 + lane;
    if (t < length) {
      float sum = bias == nullptr ? 0.0f : to_float(*bias);
#pragma unroll
      for (int i = 0; i < kConvWarps; ++i) sum += partial[i][warp * 32 + lane];
      store_float(out + static_cast<int64_t>(b) * length + t, sum);
    }
  }
}

template <typename T>
cudaError_t launch_conv(void* out, const UnfoldInput& input, const void* weight, const void* bias, int64_t kernel,
                        int64_t length, int64_t dilation, cudaStream_t stream) {
  if (input.batch * length == 0) return cudaSuccess;
  Samples<T> in{static_cast<const T*>(input.history), static_cast<const T*>(input.x),
                {input.history_strides[0], input.history_strides[1], input.history_strides[2]},
                {input.x_strides[0], input.x_strides[1], input.x_strides[2]}, static_cast<int>(input.context)};
  const dim3 grid(static_cast<unsigned>((length + kConvOutputs * 32 - 1) / (kConvOutputs * 32)),
                  static_cast<unsigned>(input.batch));
  auto conv = kernel == 7 ? conv_to_one_channel_kernel<T, 7> : conv_to_one_channel_kernel<T, 0>;
  launch_kernel(conv, grid, dim3(32 * kConvWarps), stream, static_cast<T*>(out), in, static_cast<const T*>(weight),
                static_cast<const T*>(bias), static_cast<int>(input.channels), static_cast<int>(kernel),
                static_cast<int>(dilation), static_cast<int>(length));
  return cudaGetLastError();
}

// The transposed convs' GEMM rows [(c, r), n] (channel, phase; column n = (stream, frame)) put in sample order
// [c, n, r] with bias[c * phases + r] added. A block takes one channel's run of 2 * kInterleaveThreads columns:
// thread t reads columns 2t and 2t + 1 of each phase's row (one 4- or 8-byte load a phase, coalesced), adds the
// bias, and puts its 2 * P outputs, which are contiguous in `out`, in shared memory as 32-bit words; the block
// then writes its run's outputs as consecutive words (coalesced). Why: torch's add over the permuted view reads
// with a stride of N a phase; the first form of this kernel (a column a thread, an element a store, a runtime
// division an element) ran at half a copy's speed in bf16 (run 145, an H100: 0.29 ms for the 64-stream packet's
// four reorders, a plain copy of their bytes 0.14 ms; this form 0.143 ms, run 147). P is a template argument
// so that the index arithmetic is constant; a word of padding every 32 keeps the stores to shared memory free
// of bank conflicts when a thread's word count is even. One rounding of a + b, as torch's add: bit-identical.
// Needs an even N.
constexpr int kInterleaveThreads = 256;
constexpr int kInterleaveColumns = 2 * kInterleaveThreads;
constexpr int kInterleaveMaxPhases = 8;

template <typename T>
struct ColumnPair;
template <>
struct ColumnPair<float> {
  using type = float2;
};
template <>
struct ColumnPair<bf16> {
  using type = __nv_bfloat162;
};

template <typename T, int P>
__global__ void __launch_bounds__(kInterleaveThreads)
    interleave_phases_kernel(T* __restrict__ out, const T* __restrict__ rows, const T* __restrict__ bias,
                             int64_t columns) {
  using Pair = typename ColumnPair<T>::type;
  constexpr int kWords = 2 * P * static_cast<int>(sizeof(T)) / 4;  // a thread's outputs as 32-bit words
  constexpr int kPad = kWords % 2 == 0 ? 1 : 0;
  __shared__ uint32_t stage[kInterleaveThreads * kWords + kPad * kInterleaveThreads * kWords / 32];
  begin_dependent_kernel();
  const int64_t c = blockIdx.y;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kInterleaveColumns;
  const int count = static_cast<int>(min(static_cast<int64_t>(kInterleaveColumns), columns - first));
  const int t = threadIdx.x;
  if (2 * t < count) {
    union {
      T values[2 * P];
      uint32_t words[kWords];
    } outputs;
#pragma unroll
    for (int r = 0; r < P; ++r) {
      const int64_t row = c * P + r;
      const Pair pair = *reinterpret_cast<const Pair*>(rows + row * columns + first + 2 * t);
      const float b = to_float(bias[row]);
      store_float(&outputs.values[r], to_float(pair.x) + b);
      store_float(&outputs.values[P + r], to_float(pair.y) + b);
    }
#pragma unroll
    for (int k = 0; k < kWords; ++k) {
      const int word = t * kWords + k;
      stage[word + kPad * (word >> 5)] = outputs.words[k];
    }
  }
  __syncthreads();
  const int words = count * kWords / 2;
  uint32_t* target = reinterpret_cast<uint32_t*>(out + (c * columns + first) * P);
  for (int word = t; word < words; word += kInterleaveThreads) target[word] = stage[word + kPad * (word >> 5)];
}

template <typename T, int P>
cudaError_t launch_interleave(void* out, const void* rows, const void* bias, int64_t channels, int64_t columns,
                              cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((columns + kInterleaveColumns - 1) / kInterleaveColumns),
                  static_cast<unsigned>(channels));
  launch_kernel(interleave_phases_kernel<T, P>, grid, dim3(kInterleaveThreads), stream, static_cast<T*>(out),
                static_cast<const T*>(rows), static_cast<const T*>(bias), columns);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_interleave(void* out, const void* rows, const void* bias, int64_t channels, int64_t phases,
                              int64_t columns, cudaStream_t stream) {
  switch (phases) {
    case 1: return launch_interleave<T, 1>(out, rows, bias, channels, columns, stream);
    case 2: return launch_interleave<T, 2>(out, rows, bias, channels, columns, stream);
    case 3: return launch_interleave<T, 3>(out, rows, bias, channels, columns, stream);
    case 4: return launch_interleave<T, 4>(out, rows, bias, channels, columns, stream);
    case 5: return launch_interleave<T, 5>(out, rows, bias, channels, columns, stream);
    case 6: return launch_interleave<T, 6>(out, rows, bias, channels, columns, stream);
    case 7: return launch_interleave<T, 7>(out, rows, bias, channels, columns, stream);
    case 8: return launch_interleave<T, 8>(out, rows, bias, channels, columns, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t interleave_phases(void* out, const void* rows, const void* bias, int64_t channels, int64_t phases,
                              int64_t columns, int element_bytes, cudaStream_t stream) {
  if (channels * columns == 0) return cudaSuccess;
  if (phases < 1 || phases > kInterleaveMaxPhases || channels > 65535 || columns % 2 != 0 ||
      (columns + kInterleaveColumns - 1) / kInterleaveColumns > INT32_MAX ||
      reinterpret_cast<uintptr_t>(rows) % (2 * element_bytes) != 0 || reinterpret_cast<uintptr_t>(out) % 4 != 0) {
    return cudaErrorInvalidValue;
  }
  if (element_bytes == 4) return launch_interleave<float>(out, rows, bias, channels, phases, columns, stream);
  if (element_bytes == 2) return launch_interleave<bf16>(out, rows, bias, channels, phases, columns, stream);
  return cudaErrorInvalidValue;
}

cudaError_t conv_to_one_channel(void* out, const UnfoldInput& input, const void* weight, const void* bias,
                                int64_t kernel, int64_t length, int64_t dilation, int element_bytes,
                                cudaStream_t stream) {
  if (length > INT32_MAX || input.batch > 65535 || input.channels > INT32_MAX || kernel > INT32_MAX ||
      (input.context > 0 && input.history == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (element_bytes == 4) return launch_conv<float>(out, input, weight, bias, kernel, length, dilation, stream);
  if (element_bytes == 2) return launch_conv<bf16>(out, input, weight, bias, kernel, length, dilation, stream);
  return cudaErrorInvalidValue;
}

namespace {
// A history wherever it has samples; SnakeBeta's frequency and inverse beta when it is set, and a tail of 1 to
// `length` samples.
bool valid_samples(const UnfoldInput& input, const SnakeParameters* snake, int64_t length) {
  if (input.context > 0 && input.history == nullptr) return false;
  return snake == nullptr || (snake->frequency != nullptr && snake->inverse_beta != nullptr &&
                              (snake->tail == nullptr || (snake->tail_length >= 1 && snake->tail_length <= length)));
}
}  // namespace

cudaError_t unfold_columns(void* out, const UnfoldInput& input, const SnakeParameters* snake, int64_t kernel,
                           int64_t length, int64_t dilation, int element_bytes, cudaStream_t stream) {
  if (length > INT32_MAX || input.batch > INT32_MAX || kernel > INT32_MAX || input.context > INT32_MAX ||
      !valid_samples(input, snake, length)) {
    return cudaErrorInvalidValue;
  }
  if (element_bytes == 4) return launch<float>(out, input, snake, kernel, length, dilation, stream);
  if (element_bytes == 2) return launch<bf16>(out, input, snake, kernel, length, dilation, stream);
  return cudaErrorInvalidValue;
}

cudaError_t time_major_samples(void* out, const UnfoldInput& input, const SnakeParameters* snake, int64_t length,
                               int element_bytes, cudaStream_t stream) {
  if (length > INT32_MAX || input.channels > INT32_MAX || input.batch > 65535 || !valid_samples(input, snake, length)) {
    return cudaErrorInvalidValue;
  }
  if (element_bytes == 4) return launch_time_major<float>(out, input, snake, length, stream);
  if (element_bytes == 2) return launch_time_major<bf16>(out, input, snake, length, stream);
  return cudaErrorInvalidValue;
}

}  // namespace q3tts
