#include "ops/bitlinear.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "ops/dispatch.hpp"
#include "ops/elementwise.hpp"
#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/kernel.hpp"
#include "runtime/sequence.hpp"

namespace bitnet::ops {
namespace {

constexpr int64_t kTile = 64;

int64_t padded(int64_t k) { return (k + 15) / 16 * 16; }

bool use_hardware_dot(const Device& device, std::optional<bool> requested) {
  const bool available = device.feature("integer_dot_product");
  if (requested) {
    if (*requested && !available)
      throw UnsupportedError("device '" + device.info().name +
                             "' has no integer dot product instructions");
    return *requested;
  }
  return available && device.feature("integer_dot_product_accelerated");
}

std::string dot_variant(const char* base, bool hardware) {
  return std::string(base) + (hardware ? "_dot" : "_int");
}

void require_ternary_any_scales(const QuantizedWeights& w) {
  if (w.binary) throw UnsupportedError("bitlinear takes ternary weights, not binary ones");
}

void require_ternary(const QuantizedWeights& w) {
  require_ternary_any_scales(w);
  if (w.group_size != 0)
    throw UnsupportedError("bitlinear takes weights with one scale per tensor; group_size=" +
                           std::to_string(w.group_size) + " is not supported here (bitlinear, its backward and ternary_matmul take it)");
}

// Interleaved, zero-padded int8 rows and their sums (see shaders/bitlinear/bitlinear_common.glsl).
struct PreparedRows {
  Tensor values;    // uint8 [rows, padded K]
  Tensor row_sums;  // int32 [rows]
};

PreparedRows interleave_int8(Sequence& sequence, const Tensor& values, int64_t rows, int64_t k,
                             bool transposed) {
  const auto& device = values.device_ptr();
  PreparedRows out{Tensor::empty(device, std::vector<int64_t>{rows, padded(k)}, DType::uint8),
                   Tensor::empty(device, std::vector<int64_t>{rows}, DType::int32)};
  Kernel kernel = Kernel::builtin(device, "int8_interleave", {{0, transposed}});
  struct {
    uint32_t rows, k, padded_k;
  } push{static_cast<uint32_t>(rows), static_cast<uint32_t>(k), static_cast<uint32_t>(padded(k))};
  BufferBinding bindings[] = {values.binding(), out.values.binding(), out.row_sums.binding()};
  sequence.dispatch(kernel, {workgroups(*device, rows, 1), 1, 1}, bindings, push_bytes(push));
  return out;
}

bool has_tensor_cores(const Device& device) { return device.feature("cooperative_matrix_int8"); }

// The matmul path for more than a few rows: automatic picks tensor cores where the device has
// int8 cooperative matrices, else the tiled integer-dot-product kernel.
BitLinearAlgorithm matmul_path(const Device& device, BitLinearAlgorithm requested) {
  if (requested == BitLinearAlgorithm::coopmat && !has_tensor_cores(device))
    throw UnsupportedError("algorithm='coopmat' needs int8 cooperative matrices "
                           "(VK_NV_cooperative_matrix, 16x16x32 int8, subgroups of 32), which "
                           "device '" + device.info().name + "' does not have");
  if (requested == BitLinearAlgorithm::automatic || requested == BitLinearAlgorithm::matvec)
    return has_tensor_cores(device) ? BitLinearAlgorithm::coopmat : BitLinearAlgorithm::tiled;
  return requested;
}

struct TiledOutputs {
  std::optional<Tensor> y, accumulators;
};

// The bindings the tiled and the cooperative-matrix kernels share after their weight bindings
// (activations, scales, gamma, bias, y, accumulators), and their dispatch over tile_m x tile_n
// output tiles.
void dispatch_tiles(Sequence& sequence, const Kernel& kernel, std::vector<BufferBinding> bindings,
                    const PreparedRows& a, bool with_row_sums, int64_t m, int64_t n, int64_t k,
                    uint32_t tile_m, uint32_t tile_n, const Tensor& scales, const Tensor& gamma,
                    const std::optional<Tensor>& bias, const TiledOutputs& out) {
  const Tensor& any = out.y ? *out.y : *out.accumulators;
  bindings.push_back(a.values.binding());
  if (with_row_sums) bindings.push_back(a.row_sums.binding());
  for (const Tensor* t : {&scales, &gamma, bias ? &*bias : &gamma, out.y ? &*out.y : &any,
                          out.accumulators ? &*out.accumulators : &any})
    bindings.push_back(t->binding());
  struct {
    uint32_t m, n, blocks;
  } push{static_cast<uint32_t>(m), static_cast<uint32_t>(n), static_cast<uint32_t>(padded(k) / 16)};
  const auto grid = checked_grid(*kernel.device(),
                                 {static_cast<uint64_t>((n + tile_n - 1) / tile_n),
                                  static_cast<uint64_t>((m + tile_m - 1) / tile_m), 1},
                                 "matrix of " + std::to_string(m) + " x " + std::to_string(n));
  sequence.dispatch(kernel, grid, bindings, push_bytes(push));
}

void record_tiled(Sequence& sequence, const Tensor& b, const PreparedRows& a, int64_t m, int64_t n,
                  int64_t k, bool ternary, const Tensor& scales, const Tensor& gamma,
                  const std::optional<Tensor>& bias, bool residual, const TiledOutputs& out, bool hardware) {
  Kernel kernel = Kernel::builtin(b.device_ptr(), dot_variant("bitlinear_tiled", hardware),
                                  {{0, ternary}, {1, bias.has_value()}, {2, out.y.has_value()},
                                   {3, out.accumulators.has_value()}, {4, residual}});
  dispatch_tiles(sequence, kernel, {b.binding()}, a, true, m, n, k, kTile, kTile, scales, gamma,
                 bias, out);
}

// Output rows a matvec subgroup computes together (its accumulators are M x rows registers) and
// the vectors of each row a lane loads at once (`fallback` unless set), or BITNET_GPU_MATVEC_ROWS
// (1 to 16) and BITNET_GPU_MATVEC_UNROLL (1 to 4) for tuning.
// Four rows for long rows and few activation rows (measured best on the H100 from K = 8192), and
// for 4 to 8 activation rows of weights of at least 2^24 values (N K); two otherwise. H100, whole
// calls, µs, two rows -> four (bench_knobs.py, benchmarks/results/knobs-batch-h100.json,
// 2026-11-24): (4, 2560, 6912) 17.82 -> 16.35, (8, 2560, 6912) 29.50 -> 22.59, (4, 6912, 2560)
// 20.03 -> 18.74, (8, 6912, 2560) 28.42 -> 26.61, (8, 4096, 4096) 20.86 -> 20.45; but
// (4, 2560, 3840) 14.02 -> 14.66, (8, 2560, 3840) 17.73 -> 19.78 and (2, 2560, 3840) 9.57 -> 11.07.
uint32_t matvec_rows(int64_t m, int64_t k, int64_t n) {
  const bool four = (k >= 8192 && m <= 4) || (m >= 4 && n * padded(k) >= (int64_t{1} << 24));
  return tuning_value("BITNET_GPU_MATVEC_ROWS", four ? 4 : 2, 16);
}
uint32_t matvec_unroll(uint32_t fallback = 1) { return tuning_value("BITNET_GPU_MATVEC_UNROLL", fallback, 4); }
// Whether a fused matvec requests its first weights before its pre-pass, or
// BITNET_GPU_MATVEC_PREFETCH=0|1. Measured on the H100 in the 2B4T decode step (2026-11-23): q/k/v
// 8.6 -> 8.0 us and o 7.9 -> 7.6 us with it; the gate/up dispatch with the gated output (864
// workgroups) 11.9 -> 13.3 us and (1, 8192, 8192) 12.0 -> 17.8 us, so it is on for rows up to
// 4096 values and one output per weight row.
bool matvec_prefetch(int64_t k, bool gated_out) {
  return environment_switch("BITNET_GPU_MATVEC_PREFETCH").value_or(k <= 4096 && !gated_out);
}
// Whether a fused matvec multiplies the weights' codes masked in place (bitlinear_matvec.comp's
// MASKED_CODES: one AND a part of a word instead of a shift and an AND, four accumulators a row), or
// BITNET_GPU_MATVEC_MASKED=0|1. On for one activation row but not for the gated output. Measured on
// the H100 (2026-11-23), kernel alone, µs, shifted -> masked (bench_matvec_variants.py): (1, 16384,
// 16384) 32.9 -> 32.4, (1, 12288, 12288) 18.4 -> 17.7, (1, 8192, 8192) 11.2 -> 10.8, (1, 6912, 2560)
// 9.0 -> 8.8, the same at (1, 2560, 6912) and (1, 4096, 4096); two rows (2, 8192, 8192) 16.5 -> 16.8
// (98 registers against 62). In the 2B4T decode step (bench_knobs.py) the gate/up dispatch with its
// gated output took 11.85-12.05 -> 12.37-12.70 µs; o and down moved by less than 0.3 µs.
bool matvec_masked_codes(int64_t m, bool gated_out) {
  return environment_switch("BITNET_GPU_MATVEC_MASKED").value_or(m == 1 && !gated_out);
}

// The cooperative-matrix kernel's shape: its TILE_M x TILE_N output tile and K step, how its 8
// subgroups split the tile (subgroup_rows x (8 / subgroup_rows) parts) and how many K steps it
// loads ahead (depth).
struct CoopmatTile {
  uint32_t m = 128, n = 128, k = 64, subgroup_rows = 2, depth = 2;
};

// An m x n tile with K steps of k, its subgroups 4 x 2 from 128 tile rows (else 2 x 4), loading
// two steps ahead.
CoopmatTile default_layout(uint32_t m, uint32_t n, uint32_t k) { return {m, n, k, m >= 128 ? 4u : 2u, 2}; }

// The tile for an m x n output, the one with the least estimated time among
//   256 x 128, K steps of 64, 4 x 2 subgroups, 2 steps loaded ahead (241 registers on the H100:
//     one workgroup a multiprocessor),
//   128 x 128, K steps of 128, 4 x 2 subgroups, 2 ahead (187 registers, one),
//   64 x 128, K steps of 128, 2 x 4 subgroups, 2 ahead (one),
//   128 x 128, K steps of 64, 2 x 4 subgroups, 1 ahead (128 registers: two a multiprocessor),
// counted as rounds of workgroups (one or two on each multiprocessor) times the tile's values
// times its cost per value: 1, 1.05, 1.5 and 2.05, fitted on the H100 so that the choice is the
// fastest of the four on each shape measured (2026-11-23, ninth session, after the 16-byte
// epilogue, which sped the one-a-multiprocessor tiles up more than the two-a-multiprocessor one;
// benchmarks/results/knobs-coopmat-tiles-h100.json, kernel alone in us, the four in that order):
// (2048, 4096, 4096) 145.3 / 149.2 / 203.8 / 152.2, (2048, 2560, 6912) 186.7 / 170.6 / 227.6 /
// 184.7, (2048, 6912, 2560) 233.1 / 178.5 / 215.8 / 233.2, (1024, 4096, 4096) 73.6 / 77.0 / 101.2 /
// 78.8, (512, 2560, 6912) 46.4 / 49.8 / 65.1 / 51.3, (512, 4096, 4096) 70.4 / 40.3 / 52.4 / 52.4,
// (128, 4096, 4096) 74.7 / 38.9 / 27.0 / 49.4, and a 512-token prefill's projections: (512, 2560,
// 3840) 45.7 / 26.7 / 34.6 / 33.8, (512, 2560, 2560) 44.9 / 26.4 / 33.9 / 33.6, (512, 2560, 13824)
// 96.7 / 100.2 / 114.5 / 99.4, (512, 6912, 2560) 107.5 / 61.5 / 78.2 / 83.3. A whole number of
// rounds matters more than the tile.
// Where the multiprocessor count is unknown: 256 x 128 from m = 1024, else 64 x 128 with K steps
// of 64.
// Tuning: BITNET_GPU_COOPMAT_TILE=MxN[xK] (M and N multiples of 64 up to 256, K 64 or 128; 4 x 2
// subgroups from 128 tile rows, else 2 x 4, 2 steps ahead, unless set),
// BITNET_GPU_COOPMAT_SUBGROUP_ROWS (1, 2, 4 or 8, parts of multiples of 16),
// BITNET_GPU_COOPMAT_DEPTH (1 or 2: (2048, 4096, 4096) 195 -> 177 us with 2 for 256 x 128).
CoopmatTile coopmat_tile(const Device& device, int64_t rows, int64_t cols) {
  CoopmatTile tile = default_layout(rows >= 1024 ? 256u : 64u, 128, 64);
  if (const uint32_t multiprocessors = device.info().multiprocessors) {
    struct Candidate {
      CoopmatTile tile;
      uint32_t per_multiprocessor;
      double cost_per_value;
    };
    const Candidate candidates[] = {{{256, 128, 64, 4, 2}, 1, 1.0},
                                    {{128, 128, 128, 4, 2}, 1, 1.05},
                                    {{64, 128, 128, 2, 2}, 1, 1.5},
                                    {{128, 128, 64, 2, 1}, 2, 2.05}};
    double best = 0.0;
    for (size_t i = 0; i < std::size(candidates); ++i) {
      const auto& c = candidates[i];
      const uint64_t groups = static_cast<uint64_t>((rows + c.tile.m - 1) / c.tile.m) *
                              ((cols + c.tile.n - 1) / c.tile.n);
      const uint64_t slots = uint64_t{multiprocessors} * c.per_multiprocessor;
      const double estimate = static_cast<double>((groups + slots - 1) / slots) * c.tile.m * c.tile.n *
                              c.cost_per_value;
      if (i == 0 || estimate < best) {
        best = estimate;
        tile = c.tile;
      }
    }
  }
  if (const char* text = std::getenv("BITNET_GPU_COOPMAT_TILE"); text && *text) {
    unsigned m = 0, n = 0, k = 64;
    const int fields = std::sscanf(text, "%ux%ux%u", &m, &n, &k);
    if (fields < 2 || m == 0 || m % 64 || m > 256 || n == 0 || n % 64 || n > 256 ||
        (k != 64 && k != 128))
      throw ArgumentError("BITNET_GPU_COOPMAT_TILE=" + std::string(text) +
                          ": expected MxN or MxNxK, M and N multiples of 64 up to 256, K 64 or 128");
    tile = default_layout(m, n, k);
  }
  tile.depth = tuning_value("BITNET_GPU_COOPMAT_DEPTH", tile.depth, 2);
  if (const char* text = std::getenv("BITNET_GPU_COOPMAT_SUBGROUP_ROWS"); text && *text) {
    const uint32_t r = tuning_value("BITNET_GPU_COOPMAT_SUBGROUP_ROWS", 2, 8);
    if ((r != 1 && r != 2 && r != 4 && r != 8) || tile.m % (16 * r) || tile.n % (16 * (8 / r)))
      throw ArgumentError("BITNET_GPU_COOPMAT_SUBGROUP_ROWS=" + std::string(text) + ": expected 1, 2, 4 or 8 "
                          "splitting the " + std::to_string(tile.m) + "x" + std::to_string(tile.n) +
                          " tile into multiples of 16");
    tile.subgroup_rows = r;
  }
  return tile;
}

void record_coopmat(Sequence& sequence, const Tensor& b, const PreparedRows& a, int64_t m, int64_t n,
                    int64_t k, bool ternary, const Tensor& scales, const Tensor& gamma,
                    const std::optional<Tensor>& bias, bool residual, const TiledOutputs& out) {
  const auto& device = b.device_ptr();
  const CoopmatTile tile = coopmat_tile(*device, m, n);
  const uint32_t tile_m = tile.m, tile_n = tile.n, blocks = tile.k / 16;
  const uint64_t shared_bytes = uint64_t{tile_m + tile_n} * (blocks + 1) * 16;
  if (shared_bytes > device->limits().maxComputeSharedMemorySize)
    throw UnsupportedError("cooperative-matrix tile " + std::to_string(tile_m) + "x" +
                           std::to_string(tile_n) + "x" + std::to_string(tile.k) + " needs " +
                           std::to_string(shared_bytes) + " bytes of shared memory; this device has " +
                           std::to_string(device->limits().maxComputeSharedMemorySize));
  // VECTOR_ROWS: rows of y, the accumulators, the residual and the bias of whole 16-byte vectors
  // (every binding starts at its buffer's start). FULL_TILES: no partial tile or K step.
  const bool vector_rows = n % 4 == 0;
  const bool full_tiles = m % tile_m == 0 && n % tile_n == 0 && (padded(k) / 16) % blocks == 0;
  Kernel kernel = Kernel::builtin(device, "bitlinear_coopmat",
                                  {{0, ternary}, {1, bias.has_value()}, {2, out.y.has_value()},
                                   {3, out.accumulators.has_value()}, {4, int64_t{tile_m}},
                                   {5, int64_t{tile_n}}, {6, int64_t{blocks}},
                                   {7, int64_t{tile.subgroup_rows}}, {8, int64_t{tile.depth}}, {9, residual},
                                   {10, vector_rows}, {11, full_tiles}});
  dispatch_tiles(sequence, kernel, {b.binding(), b.binding()}, a, false, m, n, k, tile_m, tile_n,
                 scales, gamma, bias, out);
}

// bias: [N], or with `residual` an [M, N] residual added element by element.
void record_matmul(BitLinearAlgorithm path, Sequence& sequence, const Tensor& b,
                   const PreparedRows& a, int64_t m, int64_t n, int64_t k, bool ternary,
                   const Tensor& scales, const Tensor& gamma, const std::optional<Tensor>& bias,
                   bool residual, const TiledOutputs& out, bool hardware) {
  if (path == BitLinearAlgorithm::coopmat)
    record_coopmat(sequence, b, a, m, n, k, ternary, scales, gamma, bias, residual, out);
  else
    record_tiled(sequence, b, a, m, n, k, ternary, scales, gamma, bias, residual, out, hardware);
}

// Whether the pre-pass for rows of k values is spread over chunks of rows (two dispatches of
// many workgroups) rather than one workgroup a row: for a few long rows, where one workgroup a
// row leaves the GPU idle. BITNET_GPU_PREPARE_SPLIT=0 or 1 overrides, for tuning.
bool split_prepare(int64_t k, BitLinearAlgorithm algorithm) {
  if (k % 4 != 0 || k > int64_t{1} << 30) return false;
  if (auto forced = environment_switch("BITNET_GPU_PREPARE_SPLIT")) return *forced;
  // Measured on the H100: a gain from K = 16384 (46 -> 41 us), a loss of about 1 us below.
  return algorithm == BitLinearAlgorithm::matvec && k >= 12288;
}

// x [m, k] to interleaved int8 rows, their sums and their scales (bitlinear_prepare*.comp).
// The inputs the single-pass pre-pass can fuse in front of the quantization: relu(x)^2 * up, then an
// RMS norm (see bitlinear_prepare.comp; only for rows it keeps in registers).
struct FusedInput {
  const Tensor* up = nullptr;
  const Tensor* norm_weight = nullptr;
  float norm_eps = 0.0f;
  bool any() const { return up || norm_weight; }
};

// Vectors of 4 values each invocation of a workgroup of local_size holds for a row of k values
// (the pre-passes' and the fused matvec's CACHED), and the most they hold in registers.
int64_t lane_vectors(int64_t k, int64_t local_size = 256) { return (padded(k) / 4 + local_size - 1) / local_size; }
constexpr int64_t kMostLaneVectors = 16;

bool can_fuse_input(int64_t k) { return k % 4 == 0 && lane_vectors(k) <= kMostLaneVectors; }

void record_prepare(Sequence& sequence, const Tensor& x, int64_t m, int64_t k,
                    const PreparedRows& prepared, const Tensor& scales, const Tensor& nonfinite,
                    BitLinearAlgorithm algorithm, const FusedInput& fused = {}) {
  const auto& device = x.device_ptr();
  if (fused.any() || !split_prepare(k, algorithm)) {
    // The kernel's CACHED: 1 where rows are too long to hold (its loop path), which keeps that
    // path's registers few too.
    const int64_t cached = lane_vectors(k) <= kMostLaneVectors ? lane_vectors(k) : 1;
    Kernel prepare = Kernel::builtin(device, float_variant("bitlinear_prepare", x.dtype()),
                                     {{0, double{kEps}}, {1, fused.norm_weight != nullptr},
                                      {2, fused.up != nullptr}, {3, cached}});
    struct {
      uint32_t rows, k, padded_k;
      float norm_eps;
    } push{static_cast<uint32_t>(m), static_cast<uint32_t>(k), static_cast<uint32_t>(padded(k)),
           fused.norm_eps};
    BufferBinding bindings[] = {x.binding(), x.binding(), prepared.values.binding(),
                                scales.binding(), prepared.row_sums.binding(), nonfinite.binding(),
                                (fused.norm_weight ? *fused.norm_weight : x).binding(),
                                (fused.up ? *fused.up : x).binding()};
    sequence.dispatch(prepare, {workgroups(*device, m, 1), 1, 1}, bindings, push_bytes(push));
    return;
  }
  constexpr int64_t kChunkValues = 2048;  // CHUNK vectors of 4 in bitlinear_prepare_split.comp
  const int64_t chunks = (padded(k) + kChunkValues - 1) / kChunkValues;
  Tensor partial = Tensor::empty(device, std::vector<int64_t>{m, chunks}, DType::float32);
  struct {
    uint32_t rows, k, padded_k, chunks;
  } push{static_cast<uint32_t>(m), static_cast<uint32_t>(k), static_cast<uint32_t>(padded(k)),
         static_cast<uint32_t>(chunks)};
  BufferBinding bindings[] = {x.binding(), partial.binding(), prepared.values.binding(),
                              scales.binding(), prepared.row_sums.binding(), nonfinite.binding()};
  for (uint32_t phase : {0u, 1u}) {
    Kernel kernel = Kernel::builtin(device, float_variant("bitlinear_prepare_split", x.dtype()),
                                    {{0, double{kEps}}, {1, int64_t{phase}}});
    sequence.dispatch(kernel, {static_cast<uint32_t>(chunks), static_cast<uint32_t>(m), 1},
                      bindings, push_bytes(push));
  }
}

// The activation pre-pass's results: int8 rows with their sums, per-row scales, and the NaN/Inf
// counter the caller checks once the sequence has run.
struct Prepared {
  PreparedRows rows;
  Tensor scales;
  Tensor nonfinite;
};

Prepared prepare_rows(Sequence& sequence, const Tensor& x, int64_t m, int64_t k,
                      BitLinearAlgorithm algorithm, const FusedInput& fused = {}) {
  const auto& device = x.device_ptr();
  Prepared p{{Tensor::empty(device, std::vector<int64_t>{m, padded(k)}, DType::uint8),
              Tensor::empty(device, std::vector<int64_t>{m}, DType::int32)},
             Tensor::empty(device, std::vector<int64_t>{m}, DType::float32),
             zeroed_counter(device)};
  record_prepare(sequence, x, m, k, p.rows, p.scales, p.nonfinite, algorithm, fused);
  return p;
}

// y = acc * gamma / s (+ bias [N], or + residual [M, N]) for up to kMatvecMaxRows prepared rows.
void record_matvec(Sequence& sequence, const QuantizedWeights& w, const PreparedRows& prepared,
                   const Tensor& scales, int64_t m, const std::optional<Tensor>& bias, bool residual,
                   const Tensor& y, const std::optional<Tensor>& accumulators, bool hardware) {
  const auto& device = y.device_ptr();
  const int64_t k = w.cols, n = w.rows;
  const uint32_t words = static_cast<uint32_t>(padded(k) / 16);
  const bool vectors = words % 4 == 0;
  const uint32_t rows = matvec_rows(m, k, n), unroll = matvec_unroll();
  Kernel kernel = Kernel::builtin(device, dot_variant("bitlinear_matvec", hardware),
                                  {{0, int64_t{m}}, {1, int64_t{rows}}, {2, bias.has_value()},
                                   {3, accumulators.has_value()}, {4, vectors}, {5, int64_t{unroll}},
                                   {6, residual}});
  // Each subgroup takes `rows` rows at a time; a workgroup one round of its subgroups.
  const uint32_t subgroups = subgroups_in(*device);
  const uint32_t rows_per_group = rows * subgroups;
  struct {
    uint32_t n, words_per_row, rows_per_group;
  } push{static_cast<uint32_t>(n), words, rows_per_group};
  const Tensor& acc = accumulators ? *accumulators : y;
  BufferBinding bindings[] = {w.packed.binding(), w.packed.binding(), prepared.values.binding(),
                              prepared.row_sums.binding(), scales.binding(), w.scales.binding(),
                              (bias ? *bias : w.scales).binding(), y.binding(), acc.binding()};
  const auto grid = checked_grid(*device, {(static_cast<uint64_t>(n) + rows_per_group - 1) / rows_per_group, 1, 1},
                                 "N = " + std::to_string(n));
  sequence.dispatch(kernel, grid, bindings, push_bytes(push));
}

// A fused matvec's grid: `local_size` invocations a workgroup, and either one workgroup for each
// run of rows (groups == 0) or `groups` workgroups dealing the rows out to their subgroups in
// turn (the shader's STRIDED).
struct MatvecGrid {
  uint32_t local_size = 256;
  uint32_t groups = 0;
};

// Whether bitlinear_matvec.comp's FUSED variant, with workgroups of local_size, takes m float32
// rows of k values: the rows held in registers (kMostLaneVectors at most) and then in shared memory
// beside the reduction scratch (four arrays of 256 words, indexed by subgroup, and one word an
// invocation), and its 18 storage buffers allowed (devices allowing fewer keep the separate
// pre-pass).
bool fused_matvec_fits(const Tensor& x, int64_t m, int64_t k, uint32_t local_size) {
  const Device& device = x.device();
  const auto& limits = device.limits();
  const int64_t scratch = 4 * 256 * 4 + 4 * int64_t{local_size};
  return x.dtype() == DType::float32 && k % 4 == 0 && lane_vectors(k, local_size) <= kMostLaneVectors &&
         local_size <= limits.maxComputeWorkGroupInvocations && local_size <= limits.maxComputeWorkGroupSize[0] &&
         subgroups_in(device, local_size) <= 256 && m * padded(k) + scratch <= limits.maxComputeSharedMemorySize &&
         limits.maxPerStageDescriptorStorageBuffers >= 18;
}

// record_matvec with the activation pre-pass done by every workgroup into shared memory
// (bitlinear_matvec.comp, FUSED): one dispatch instead of two. Above 8192 values of x every
// workgroup of 256 invocations quantizing the rows again costs more than the separate pre-pass
// (measured on the H100: (1, 16384, 16384) 45 us fused, 40 us not; (8, 4096, 4096) 36.6 us
// fused, 24.1 us not; (1, 4096, 4096) 7.6 us fused, 14.6 us not); the strided grid (below) takes
// some of those rows.
// Two rows fuse up to 16384 values (8192 each): the 2B4T decode step of two sequences, whose down
// projection (K = 6912) then fuses, took 2109-2110 against 2138 us; with four sequences 16384 made
// q/k/v, o and gate/up fuse and the step took 3251-3256 against 2786 us (H100, two runs each,
// model-batches-fused-{8192,16384}-run{1,2}-h100.json, 2026-11-24). BITNET_GPU_FUSED_MATVEC_MOST
// (1 to 65536) sets the limit for any number of rows, for tuning: 32768 made single calls of
// (4, 2560, 3840) and (4, 2560, 6912) 0.5 and 0.8 us faster, but (8, 2560, 6912) 22.1 -> 39.2 us,
// and the decode step of 4 sequences 2787 -> 3303 us, of 8 4080 -> 6116 us
// (knobs-fused-most-h100.json, model-batches-fused-32768-h100.json).
bool can_fuse_matvec(const Tensor& x, int64_t m, int64_t k) {
  const int64_t most = tuning_value("BITNET_GPU_FUSED_MATVEC_MOST", m <= 2 ? 16384 : 8192, 65536);
  return m * padded(k) <= most && fused_matvec_fits(x, m, k, 256);
}

// The strided grid, for one weight and long rows: one round of large workgroups filling the GPU,
// each quantizing the rows once, instead of every workgroup of 256 invocations (a few dozen output
// rows) quantizing them again (the ordinary fused matvec) or a separate pre-pass. The rows must
// fit in shared memory. Where the multiprocessor count is known, it is the default for one or two
// float32 rows of 6912 to 16384 values: 1024 invocations a workgroup and one workgroup a
// multiprocessor from 12288 values, 512 and two below. Measured on the H100 (bench_knobs.py,
// whole calls as graphs, µs, default before -> strided; 2026-11-23): (1, 16384, 16384)
// 38.8-39.2 -> 33.7 (512 x 2: 35.4); (1, 12288, 12288) 21.4-21.7 -> 18.4 (512 x 2: 19.3);
// (2, 16384, 16384) 45.1 -> 41.2; (1, 8192, 8192) 12.0 -> 11.3 (1024: 14.0); (2, 8192, 8192)
// 18.2 -> 15.5; (1, 6912, 2560) 9.4 -> 9.2; slower at (4, 4096, 4096) 15.2 -> 15.8 and
// (8, 4096, 4096) 20.6 -> 26.3, no faster at (1, 2560, 6912) and (1, 4096, 4096).
// BITNET_GPU_MATVEC_STRIDED sets the local size (0: never; 256, 512 or 1024) and
// BITNET_GPU_MATVEC_STRIDED_GROUPS the workgroups a multiprocessor (1 to 8; 1024 invocations a
// multiprocessor unless set), for tuning and tests.
std::optional<MatvecGrid> strided_matvec(const Tensor& x, int64_t m, int64_t k, int64_t n, size_t weights) {
  const Device& device = x.device();
  const bool long_rows = device.info().multiprocessors && m <= 2 && padded(k) >= 6912 && padded(k) <= 16384;
  const uint32_t local_size = environment_choice("BITNET_GPU_MATVEC_STRIDED", {0, 256, 512, 1024})
                                  .value_or(long_rows ? (padded(k) >= 12288 ? 1024 : 512) : 0);
  if (local_size == 0 || weights != 1 || !fused_matvec_fits(x, m, k, local_size)) return std::nullopt;
  const uint32_t per_multiprocessor = tuning_value("BITNET_GPU_MATVEC_STRIDED_GROUPS", 1024 / local_size, 8);
  // Where the multiprocessor count is unknown (lavapipe), a few workgroups.
  const uint64_t fill = uint64_t{device.info().multiprocessors ? device.info().multiprocessors : 4} * per_multiprocessor;
  const uint64_t rows_per_round = uint64_t{matvec_rows(m, k, n)} * subgroups_in(device, local_size);
  const uint64_t needed = (static_cast<uint64_t>(n) + rows_per_round - 1) / rows_per_round;
  return MatvecGrid{local_size, static_cast<uint32_t>(std::max<uint64_t>(1, std::min(fill, needed)))};
}

// One dispatch for up to three weights sharing x (their outputs ys[i]); bias / residual and
// accumulators only with one weight. `grid`: see MatvecGrid (strided with one weight only).
// gated_out (two weights, gate and up, of one shape; whole 16-byte vectors): ys[0] = relu(gate)^2 * up.
void record_matvec_fused(Sequence& sequence, const std::vector<const QuantizedWeights*>& weights,
                         const Tensor& x, const FusedInput& fused, int64_t m,
                         const std::optional<Tensor>& bias, bool residual, const std::vector<Tensor>& ys,
                         const std::optional<Tensor>& accumulators, const Tensor& nonfinite, bool hardware,
                         bool gated_out = false, MatvecGrid grid_shape = {}) {
  const auto& device = ys[0].device_ptr();
  const QuantizedWeights& w = *weights[0];
  const int64_t k = w.cols;
  const uint32_t words = static_cast<uint32_t>(padded(k) / 16);
  const uint32_t rows = gated_out ? 2 : matvec_rows(m, k, w.rows);
  const uint32_t subgroup_size = std::max<uint32_t>(1, device->info().subgroup_size);
  // With the first weights requested before the pre-pass, a lane requests all of its vectors of
  // a row at once (up to 4), unless BITNET_GPU_MATVEC_UNROLL says otherwise.
  const bool prefetch = matvec_prefetch(k, gated_out) && words % 4 == 0;
  const uint32_t unroll =
      matvec_unroll(prefetch ? std::clamp<uint32_t>((words / 4 + subgroup_size - 1) / subgroup_size, 1, 4) : 1);
  Kernel kernel = Kernel::builtin(device, dot_variant("bitlinear_matvec", hardware) + "_fused",
                                  {{0, int64_t{m}}, {1, int64_t{rows}}, {2, bias.has_value()},
                                   {3, accumulators.has_value()}, {4, words % 4 == 0}, {5, int64_t{unroll}},
                                   {6, residual}, {7, fused.norm_weight != nullptr}, {8, fused.up != nullptr},
                                   {9, int64_t{m * padded(k) / 4}},
                                   {10, lane_vectors(k, grid_shape.local_size)},
                                   {11, static_cast<int64_t>(weights.size())}, {12, gated_out},
                                   {13, prefetch}, {14, int64_t{grid_shape.local_size}},
                                   {15, grid_shape.groups > 0}, {16, matvec_masked_codes(m, gated_out)}});
  const uint32_t subgroups = subgroups_in(*device, grid_shape.local_size);
  // A subgroup takes `rows` rows at a time, or with gated_out one output row (a gate and an up row).
  const uint32_t rows_per_group = gated_out ? subgroups : rows * subgroups;
  auto groups_of = [&](size_t i) {
    if (gated_out && i > 0) return uint64_t{0};
    return i < weights.size() ? (static_cast<uint64_t>(weights[i]->rows) + rows_per_group - 1) / rows_per_group : 0;
  };
  auto rows_of_weight = [&](size_t i) { return i < weights.size() ? static_cast<uint32_t>(weights[i]->rows) : 0u; };
  struct {
    uint32_t n, words_per_row, rows_per_group, k;
    float norm_eps, eps;
    uint32_t n_b, n_c, groups_a, groups_b;
  } push{rows_of_weight(0), words, rows_per_group, static_cast<uint32_t>(k), fused.norm_eps,
         static_cast<float>(kEps), rows_of_weight(1), rows_of_weight(2), static_cast<uint32_t>(groups_of(0)),
         static_cast<uint32_t>(groups_of(1))};
  auto weight = [&](size_t i) -> const QuantizedWeights& { return *weights[i < weights.size() ? i : 0]; };
  auto out = [&](size_t i) -> const Tensor& { return ys[i < ys.size() ? i : 0]; };
  BufferBinding bindings[] = {w.packed.binding(), w.packed.binding(), x.binding(),
                              (fused.up ? *fused.up : x).binding(),
                              (fused.norm_weight ? *fused.norm_weight : x).binding(), w.scales.binding(),
                              (bias ? *bias : w.scales).binding(), ys[0].binding(),
                              (accumulators ? *accumulators : ys[0]).binding(), nonfinite.binding(),
                              weight(1).packed.binding(), weight(1).packed.binding(), weight(1).scales.binding(),
                              out(1).binding(), weight(2).packed.binding(), weight(2).packed.binding(),
                              weight(2).scales.binding(), out(2).binding()};
  const uint64_t groups = grid_shape.groups ? grid_shape.groups : groups_of(0) + groups_of(1) + groups_of(2);
  const auto grid = checked_grid(*device, {groups, 1, 1}, "N = " + std::to_string(w.rows));
  sequence.dispatch(kernel, grid, bindings, push_bytes(push));
}

// Weights with one scale per group along K (bitlinear_grouped.comp): y and the exact
// accumulators for any M, M_TILE activation rows a workgroup.
constexpr uint32_t kGroupedRows = 2;
void record_grouped(Sequence& sequence, const QuantizedWeights& w, const PreparedRows& prepared,
                    const Tensor& scales, int64_t m, const std::optional<Tensor>& bias, const Tensor& y,
                    const std::optional<Tensor>& accumulators, bool hardware) {
  const auto& device = y.device_ptr();
  const int64_t k = w.cols, n = w.rows;
  const uint32_t words = static_cast<uint32_t>(padded(k) / 16);
  const int64_t m_tile = std::min<int64_t>(m, kMatvecMaxRows);
  Kernel kernel = Kernel::builtin(device, dot_variant("bitlinear_grouped", hardware),
                                  {{0, m_tile}, {1, bias.has_value()}, {2, accumulators.has_value()},
                                   {3, w.group_size % 16 == 0}, {4, w.group_size % 16 == 0 && words % 4 == 0},
                                   {5, int64_t{kGroupedRows}}});
  // kGroupedRows rows a subgroup at a time, one round of them a workgroup.
  const uint32_t subgroups = subgroups_in(*device);
  const uint32_t rows_per_group = kGroupedRows * subgroups;
  struct {
    uint32_t m, n, k, words_per_row, group, rows_per_group;
  } push{static_cast<uint32_t>(m), static_cast<uint32_t>(n), static_cast<uint32_t>(k), words,
         static_cast<uint32_t>(w.group_size), rows_per_group};
  const Tensor& acc = accumulators ? *accumulators : y;
  BufferBinding bindings[] = {w.packed.binding(), prepared.values.binding(), scales.binding(), w.scales.binding(),
                              (bias ? *bias : w.scales).binding(), y.binding(), acc.binding(),
                              w.packed.binding()};
  const auto grid = checked_grid(*device, {(static_cast<uint64_t>(n) + rows_per_group - 1) / rows_per_group,
                                           static_cast<uint64_t>((m + m_tile - 1) / m_tile), 1},
                                 "x of " + std::to_string(m) + " rows by N = " + std::to_string(n));
  sequence.dispatch(kernel, grid, bindings, push_bytes(push));
}

}  // namespace

std::vector<Tensor> bitlinear_group(const Tensor& x, const std::optional<Tensor>& up,
                                    const std::optional<Tensor>& norm_weight, double norm_eps,
                                    const std::vector<const QuantizedWeights*>& weights,
                                    const std::vector<std::optional<Tensor>>& residuals, bool gated_output) {
  require_float(x, "x");
  if (weights.empty()) throw ArgumentError("bitlinear_group: expected at least one weight");
  if (residuals.size() != weights.size())
    throw ArgumentError("bitlinear_group: expected one residual (or None) per weight");
  if (gated_output && (weights.size() != 2 || residuals[0] || residuals[1] || weights[0]->rows != weights[1]->rows))
    throw ArgumentError("bitlinear_group: gated_output takes two weights (gate, up) of one shape, no residuals");
  const int64_t k = weights[0]->cols;
  if (x.shape().empty() || x.shape().back() != k)
    throw ShapeError("x of shape " + shape_text(x.shape()) + " does not match weights with K = " +
                     std::to_string(k));
  const auto& device = x.device_ptr();
  if (up) {
    require_same_kind(x, "gate", *up, "up");
    if (up->shape() != x.shape())
      throw ShapeError("gate " + shape_text(x.shape()) + " and up " + shape_text(up->shape()) + " differ in shape");
  }
  if (norm_weight && (norm_weight->dtype() != DType::float32 || norm_weight->shape() != std::vector<int64_t>{k} ||
                      &norm_weight->device() != device.get()))
    throw ShapeError("norm weight: expected float32 (" + std::to_string(k) + ",) on x's device, got " +
                     std::string(dtype_name(norm_weight->dtype())) + " " + shape_text(norm_weight->shape()));
  const int64_t m = static_cast<int64_t>(x.size()) / std::max<int64_t>(k, 1);
  std::vector<std::vector<int64_t>> shapes;
  for (size_t i = 0; i < weights.size(); ++i) {
    const QuantizedWeights& w = *weights[i];
    require_ternary(w);
    if (w.cols != k) throw ShapeError("bitlinear_group: every weight must have K = " + std::to_string(k));
    if (&w.packed.device() != device.get()) throw ArgumentError("x and the weights must live on one device");
    std::vector<int64_t> shape(x.shape().begin(), x.shape().end() - 1);
    shape.push_back(w.rows);
    if (residuals[i] && (residuals[i]->dtype() != DType::float32 || residuals[i]->shape() != shape))
      throw ShapeError("residual " + std::to_string(i) + ": expected float32 " + shape_text(shape) + ", got " +
                       std::string(dtype_name(residuals[i]->dtype())) + " " + shape_text(residuals[i]->shape()));
    shapes.push_back(std::move(shape));
  }
  auto allocate = [&](size_t count) {
    std::vector<Tensor> tensors;
    for (size_t i = 0; i < count; ++i) tensors.push_back(Tensor::empty(device, shapes[i], DType::float32));
    return tensors;
  };
  // gated_output where the products were computed apart: the gating as its own op.
  auto finish = [&](std::vector<Tensor> outputs) {
    return gated_output ? std::vector<Tensor>{gated_activation(outputs[0], outputs[1], Activation::relu2)} : outputs;
  };
  if (m == 0 || k == 0) {
    std::vector<Tensor> outputs = allocate(weights.size());
    if (m > 0)
      for (size_t i = 0; i < outputs.size(); ++i)
        outputs[i] = residuals[i] ? binary(outputs[i], *residuals[i], BinaryOp::add) : outputs[i];
    return finish(outputs);
  }
  // Inputs the pre-pass cannot fuse run as their own ops first.
  Tensor input = x;
  FusedInput fused;
  if (can_fuse_input(k)) {
    fused = {up ? &*up : nullptr, norm_weight ? &*norm_weight : nullptr, static_cast<float>(norm_eps)};
  } else {
    if (up) input = gated_activation(x, *up, Activation::relu2);
    if (norm_weight) input = row_op(input, RowOp::rms_norm, norm_weight, std::nullopt, norm_eps);
  }
  const BitLinearAlgorithm algorithm =
      m <= kMatvecMaxRows ? BitLinearAlgorithm::matvec : matmul_path(*device, BitLinearAlgorithm::automatic);
  const bool hardware = use_hardware_dot(*device, std::nullopt);
  OpSequence op(device);
  Sequence& sequence = op.sequence();
  // Every matvec workgroup quantizes the rows itself, saving the pre-pass's dispatch; up to three
  // weights (q, k, v) go in that one dispatch (a residual only with one weight).
  // BITNET_GPU_FUSED_MATVEC=0 keeps the separate pre-pass.
  const bool one_dispatch = weights.size() == 1 ||
                            (weights.size() <= 3 && std::none_of(residuals.begin(), residuals.end(),
                                                                  [](const auto& r) { return r.has_value(); }));
  // Not with a fused norm: its sum of squares adds in an order that follows the local size, and
  // the fused norm stays bit for bit the pre-pass's.
  const auto strided = algorithm == BitLinearAlgorithm::matvec && !gated_output && !fused.norm_weight
                           ? strided_matvec(input, m, k, weights[0]->rows, weights.size())
                           : std::nullopt;
  if (algorithm == BitLinearAlgorithm::matvec && (strided || can_fuse_matvec(input, m, k)) && one_dispatch &&
      environment_switch("BITNET_GPU_FUSED_MATVEC").value_or(true)) {
    // gated_output with whole 16-byte weight vectors: the dispatch writes relu(gate)^2 * up itself
    // (BITNET_GPU_GATED_MATVEC=0 keeps the two products and the gating op; bit for bit the same).
    const bool gated_out = gated_output && padded(k) % 64 == 0 &&
                           environment_switch("BITNET_GPU_GATED_MATVEC").value_or(true);
    std::vector<Tensor> outputs = allocate(gated_out ? 1 : weights.size());
    Tensor nonfinite = zeroed_counter(device);
    record_matvec_fused(sequence, weights, input, fused, m, residuals[0], residuals[0].has_value(), outputs,
                        std::nullopt, nonfinite, hardware, gated_out, strided.value_or(MatvecGrid{}));
    op.run([nonfinite] { raise_if_nonfinite(nonfinite, "x"); });
    return gated_out ? outputs : finish(outputs);
  }
  std::vector<Tensor> outputs = allocate(weights.size());
  const auto [prepared, scales, nonfinite] = prepare_rows(sequence, input, m, k, algorithm, fused);
  // The tiled and tensor-core kernels add a residual in their epilogue (bit for bit the separate
  // add); BITNET_GPU_MATMUL_RESIDUAL=0 adds it as its own op instead, for tuning.
  const bool matmul_residual = environment_switch("BITNET_GPU_MATMUL_RESIDUAL").value_or(true);
  for (size_t i = 0; i < weights.size(); ++i) {
    if (algorithm == BitLinearAlgorithm::matvec)
      record_matvec(sequence, *weights[i], prepared, scales, m, residuals[i], residuals[i].has_value(),
                    outputs[i], std::nullopt, hardware);
    else
      record_matmul(algorithm, sequence, weights[i]->packed, prepared, m, weights[i]->rows, k, true, scales,
                    weights[i]->scales, matmul_residual ? residuals[i] : std::nullopt,
                    matmul_residual && residuals[i].has_value(), {outputs[i], std::nullopt}, hardware);
  }
  op.run([nonfinite] { raise_if_nonfinite(nonfinite, "x"); });
  if (algorithm != BitLinearAlgorithm::matvec && !matmul_residual)
    for (size_t i = 0; i < outputs.size(); ++i)
      if (residuals[i]) outputs[i] = binary(outputs[i], *residuals[i], BinaryOp::add);
  return finish(outputs);
}

BitLinearResult bitlinear(const Tensor& x, const QuantizedWeights& w, const std::optional<Tensor>& bias,
                          bool with_accumulators, BitLinearAlgorithm algorithm,
                          std::optional<bool> hardware_dot, const std::optional<Tensor>& out_y,
                          const std::optional<Tensor>& out_accumulators) {
  require_ternary_any_scales(w);
  require_float(x, "x");
  if (x.shape().empty() || x.shape().back() != w.cols)
    throw ShapeError("x of shape " + shape_text(x.shape()) + " does not match weights of shape (" +
                     std::to_string(w.rows) + ", " + std::to_string(w.cols) + "): K = " +
                     std::to_string(w.cols) + " must be x's last axis");
  if (bias && (bias->dtype() != DType::float32 || bias->shape() != std::vector<int64_t>{w.rows}))
    throw ShapeError("bias: expected float32 of shape (" + std::to_string(w.rows) + ",), got " +
                     std::string(dtype_name(bias->dtype())) + " " + shape_text(bias->shape()));
  const auto& device = x.device_ptr();
  if (&w.packed.device() != device.get() || (bias && &bias->device() != device.get()))
    throw ArgumentError("x, the weights and the bias must live on the same device");
  const int64_t k = w.cols, n = w.rows, m = static_cast<int64_t>(x.size()) / k;
  std::vector<int64_t> out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(n);
  if (out_accumulators && !with_accumulators)
    throw ArgumentError("out: an accumulator target needs return_accumulator=True");
  const std::initializer_list<const Tensor*> inputs{&x, &w.packed, &w.scales, bias ? &*bias : nullptr};
  // y and the accumulators differ in dtype, so two targets can never be one tensor.
  BitLinearResult result{output(device, out_y, out_shape, DType::float32, "y", inputs), std::nullopt};
  if (with_accumulators)
    result.accumulators =
        output(device, out_accumulators, out_shape, DType::int32, "accumulators", inputs);
  if (m == 0) return result;
  if (w.group_size != 0) {  // one scale per group: its own kernel, whatever M
    if (algorithm != BitLinearAlgorithm::automatic)
      throw UnsupportedError("weights with group_size=" + std::to_string(w.group_size) +
                             " run on their own kernel: leave algorithm unset");
    const bool hardware = use_hardware_dot(*device, hardware_dot);
    OpSequence op_sequence(device);
    Sequence& sequence = op_sequence.sequence();
    const auto [prepared, scales, nonfinite] = prepare_rows(sequence, x, m, k, BitLinearAlgorithm::matvec);
    record_grouped(sequence, w, prepared, scales, m, bias, result.y, result.accumulators, hardware);
    op_sequence.run([nonfinite] { raise_if_nonfinite(nonfinite, "x"); });
    return result;
  }
  if (algorithm == BitLinearAlgorithm::automatic && m <= kMatvecMaxRows)
    algorithm = BitLinearAlgorithm::matvec;
  if (algorithm != BitLinearAlgorithm::matvec) algorithm = matmul_path(*device, algorithm);
  if (algorithm == BitLinearAlgorithm::matvec && m > kMatvecMaxRows)
    throw UnsupportedError("algorithm='matvec' handles up to " + std::to_string(kMatvecMaxRows) +
                           " rows; x has " + std::to_string(m));
  const bool hardware = use_hardware_dot(*device, hardware_dot);

  OpSequence op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  // Few float32 rows that fit: every matvec workgroup quantizes them itself (no pre-pass dispatch).
  // BITNET_GPU_FUSED_MATVEC=0 keeps the separate pre-pass.
  const auto strided = algorithm == BitLinearAlgorithm::matvec ? strided_matvec(x, m, k, n, 1) : std::nullopt;
  if (algorithm == BitLinearAlgorithm::matvec && (strided || can_fuse_matvec(x, m, k)) &&
      environment_switch("BITNET_GPU_FUSED_MATVEC").value_or(true)) {
    Tensor nonfinite = zeroed_counter(device);
    record_matvec_fused(sequence, {&w}, x, {}, m, bias, false, {result.y}, result.accumulators, nonfinite,
                        hardware, false, strided.value_or(MatvecGrid{}));
    op_sequence.run([nonfinite] { raise_if_nonfinite(nonfinite, "x"); });
    return result;
  }
  const auto [prepared, scales, nonfinite] = prepare_rows(sequence, x, m, k, algorithm);
  if (algorithm == BitLinearAlgorithm::matvec) {
    record_matvec(sequence, w, prepared, scales, m, bias, false, result.y, result.accumulators, hardware);
  } else {
    record_matmul(algorithm, sequence, w.packed, prepared, m, n, k, true, scales, w.scales, bias, false,
                  {result.y, result.accumulators}, hardware);
  }
  op_sequence.run([nonfinite] { raise_if_nonfinite(nonfinite, "x"); });
  return result;
}

Tensor int8_matmul(const Tensor& a, const Tensor& b, BitLinearAlgorithm algorithm,
                   std::optional<bool> hardware_dot) {
  if (a.dtype() != DType::int8 || b.dtype() != DType::int8)
    throw DTypeError("a and b: expected int8, got " + std::string(dtype_name(a.dtype())) + " and " +
                     std::string(dtype_name(b.dtype())));
  if (a.shape().size() != 2 || b.shape().size() != 2 || a.shape()[1] != b.shape()[0])
    throw ShapeError("cannot multiply shapes " + shape_text(a.shape()) + " and " +
                     shape_text(b.shape()) + ": expected [M, K] and [K, N]");
  const auto& device = a.device_ptr();
  const int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  Tensor out = Tensor::empty(device, std::vector<int64_t>{m, n}, DType::int32);
  if (m == 0 || n == 0) return out;
  if (k == 0) {
    OpSequence op_zero(device);
    Sequence& zero = op_zero.sequence();
    zero.fill(out.binding(), 0);
    op_zero.run();
    return out;
  }
  const BitLinearAlgorithm path = matmul_path(*device, algorithm);
  const bool hardware = use_hardware_dot(*device, hardware_dot);
  OpSequence op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  PreparedRows pa = interleave_int8(sequence, a, m, k, false);
  PreparedRows pb = interleave_int8(sequence, b, n, k, true);
  record_matmul(path, sequence, pb.values, pa, m, n, k, false, pa.row_sums, pa.row_sums,
                std::nullopt, false, {std::nullopt, out}, hardware);
  op_sequence.run();
  return out;
}

Tensor ternary_matmul(const Tensor& a, const QuantizedWeights& w, BitLinearAlgorithm algorithm,
                      std::optional<bool> hardware_dot) {
  require_ternary_any_scales(w);  // the accumulators do not depend on the scales
  if (a.dtype() != DType::int8)
    throw DTypeError("a: expected int8, got " + std::string(dtype_name(a.dtype())));
  if (a.shape().size() != 2 || a.shape()[1] != w.cols)
    throw ShapeError("cannot multiply a of shape " + shape_text(a.shape()) + " by weights of shape (" +
                     std::to_string(w.rows) + ", " + std::to_string(w.cols) + ")^T");
  const auto& device = a.device_ptr();
  const int64_t m = a.shape()[0], k = w.cols, n = w.rows;
  Tensor out = Tensor::empty(device, std::vector<int64_t>{m, n}, DType::int32);
  if (m == 0) return out;
  const BitLinearAlgorithm path = matmul_path(*device, algorithm);
  const bool hardware = use_hardware_dot(*device, hardware_dot);
  OpSequence op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  PreparedRows pa = interleave_int8(sequence, a, m, k, false);
  record_matmul(path, sequence, w.packed, pa, m, n, k, true, w.scales, w.scales, std::nullopt, false,
                {std::nullopt, out}, hardware);
  op_sequence.run();
  return out;
}

Tensor bitlinear_backward_input(const Tensor& grad_y, const QuantizedWeights& w) {
  require_ternary_any_scales(w);
  if (grad_y.dtype() != DType::float32)
    throw DTypeError("grad_y: expected float32, got " + std::string(dtype_name(grad_y.dtype())));
  if (grad_y.shape().empty() || grad_y.shape().back() != w.rows)
    throw ShapeError("grad_y of shape " + shape_text(grad_y.shape()) + " does not match weights of "
                     "shape (" + std::to_string(w.rows) + ", " + std::to_string(w.cols) +
                     "): its last axis must be N = " + std::to_string(w.rows));
  const auto& device = grad_y.device_ptr();
  const int64_t n = w.rows, k = w.cols, m = static_cast<int64_t>(grad_y.size()) / n;
  std::vector<int64_t> shape(grad_y.shape().begin(), grad_y.shape().end() - 1);
  shape.push_back(k);
  Tensor out = Tensor::empty(device, shape, DType::float32);
  if (m == 0) return out;
  Kernel kernel = Kernel::builtin(device, "bitlinear_backward", {{0, w.group_size != 0}});
  struct {
    uint32_t m, n, k, words_per_row, group;
  } push{static_cast<uint32_t>(m), static_cast<uint32_t>(n), static_cast<uint32_t>(k),
         static_cast<uint32_t>(padded(k) / 16), static_cast<uint32_t>(std::max<int64_t>(w.group_size, 1))};
  BufferBinding bindings[] = {w.packed.binding(), w.scales.binding(), grad_y.binding(), out.binding()};
  OpSequence op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  sequence.dispatch(kernel, {workgroups(*device, static_cast<uint64_t>(m * k)), 1, 1}, bindings,
                    push_bytes(push));
  op_sequence.run();
  return out;
}

}  // namespace bitnet::ops
