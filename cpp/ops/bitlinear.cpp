#include "ops/bitlinear.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "ops/bitlinear_paths.hpp"
#include "ops/dispatch.hpp"
#include "ops/elementwise.hpp"
#include "ops/tuning.hpp"
#include "runtime/device.hpp"
#include "runtime/error.hpp"
#include "runtime/kernel.hpp"
#include "runtime/sequence.hpp"

namespace bitnet::ops {
namespace {

constexpr int64_t kTile = 64;

void require_ternary_any_scales(const QuantizedWeights& w) {
  if (w.binary) throw UnsupportedError("bitlinear takes ternary weights, not binary ones");
}

void require_ternary(const QuantizedWeights& w) {
  require_ternary_any_scales(w);
  if (w.group_size != 0)
    throw UnsupportedError(
        "bitlinear takes weights with one scale per tensor; group_size=" +
        std::to_string(w.group_size) +
        " is not supported here (bitlinear, its backward and ternary_matmul take it)");
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

struct TiledOutputs {
  std::optional<Tensor> y, accumulators;
};

// The bindings the tiled and the cooperative-matrix kernels share after their weight bindings
// (activations, scales, gamma, bias, y, accumulators), and their dispatch over tile_m x tile_n
// output tiles.
void dispatch_tiles(Sequence& sequence, const Kernel& kernel, std::vector<BufferBinding> bindings,
                    const PreparedRows& a, bool with_row_sums, int64_t m, int64_t n, int64_t k,
                    uint32_t tile_m, uint32_t tile_n, const Tensor& scales, const Tensor& gamma,
                    const std::optional<Tensor>& bias, const TiledOutputs& out,
                    const std::optional<KSplit>& split = std::nullopt) {
  const Tensor& any = out.y ? *out.y : *out.accumulators;
  bindings.push_back(a.values.binding());
  if (with_row_sums) bindings.push_back(a.row_sums.binding());
  for (const Tensor* t : {&scales, &gamma, bias ? &*bias : &gamma, out.y ? &*out.y : &any,
                          out.accumulators ? &*out.accumulators : &any})
    bindings.push_back(t->binding());
  const uint32_t blocks = static_cast<uint32_t>(padded(k) / 16);
  const uint64_t tiles_n = static_cast<uint64_t>((n + tile_n - 1) / tile_n),
                 tiles_m = static_cast<uint64_t>((m + tile_m - 1) / tile_m);
  const std::string what = "matrix of " + std::to_string(m) + " x " + std::to_string(n);
  if (!split) {
    struct {
      uint32_t m, n, blocks;
    } push{static_cast<uint32_t>(m), static_cast<uint32_t>(n), blocks};
    sequence.dispatch(kernel, checked_grid(*kernel.device(), {tiles_n, tiles_m, 1}, what), bindings,
                      push_bytes(push));
    return;
  }
  // The tensor-core kernel's K split: its int32 sums and a ticket a tile, zero between calls (the
  // last split of each tile zeroes them); bound to the output where K is not split.
  const auto& device = kernel.device();
  const bool splits = split->splits > 1;
  const Tensor partial = splits ? self_resetting_counters(sequence, m * n) : any;
  const Tensor tickets =
      splits ? self_resetting_counters(sequence, static_cast<int64_t>(tiles_n * tiles_m)) : any;
  bindings.push_back(partial.binding());
  bindings.push_back(tickets.binding());
  struct {
    uint32_t m, n, blocks, split_blocks;
  } push{static_cast<uint32_t>(m), static_cast<uint32_t>(n), blocks, split->blocks};
  sequence.dispatch(kernel, checked_grid(*device, {tiles_n, tiles_m, split->splits}, what),
                    bindings, push_bytes(push));
}

void record_tiled(Sequence& sequence, const Tensor& b, const PreparedRows& a, int64_t m, int64_t n,
                  int64_t k, bool ternary, const Tensor& scales, const Tensor& gamma,
                  const std::optional<Tensor>& bias, bool residual, const TiledOutputs& out,
                  bool hardware) {
  Kernel kernel = Kernel::builtin(b.device_ptr(), dot_variant("bitlinear_tiled", hardware),
                                  {{0, ternary},
                                   {1, bias.has_value()},
                                   {2, out.y.has_value()},
                                   {3, out.accumulators.has_value()},
                                   {4, residual}});
  dispatch_tiles(sequence, kernel, {b.binding()}, a, true, m, n, k, kTile, kTile, scales, gamma,
                 bias, out);
}

// khr: through VK_KHR_cooperative_matrix (bitlinear_coopmat_khr.comp), else the NV extension.
// tile_cols: the output columns the tile is chosen for (record_matmul).
void record_coopmat(Sequence& sequence, const Tensor& b, const PreparedRows& a, int64_t m,
                    int64_t n, int64_t k, bool ternary, const Tensor& scales, const Tensor& gamma,
                    const std::optional<Tensor>& bias, bool residual, const TiledOutputs& out,
                    bool khr, int64_t tile_cols) {
  const auto& device = b.device_ptr();
  const CoopmatTile tile = coopmat_tile(*device, m, tile_cols);
  const uint32_t tile_m = tile.m, tile_n = tile.n, blocks = tile.k / 16;
  const uint64_t shared_bytes = tile.shared_bytes();
  if (shared_bytes > device->limits().maxComputeSharedMemorySize)
    throw UnsupportedError("cooperative-matrix tile " + std::to_string(tile_m) + "x" +
                           std::to_string(tile_n) + "x" + std::to_string(tile.k) + " needs " +
                           std::to_string(shared_bytes) +
                           " bytes of shared memory; this device has " +
                           std::to_string(device->limits().maxComputeSharedMemorySize));
  // The output tiles of every matmul recorded with this one share the multiprocessors.
  const int64_t tiles = ((m + tile_m - 1) / tile_m) * ((tile_cols + tile_n - 1) / tile_n);
  const KSplit split = coopmat_split(*device, tile, m, n, k, tiles);
  // VECTOR_ROWS: rows of y, the accumulators, the residual and the bias of whole 16-byte vectors
  // (every binding starts at its buffer's start). FULL_TILES: no partial tile or K step.
  const bool vector_rows = n % 4 == 0;
  const bool full_tiles = m % tile_m == 0 && n % tile_n == 0 && (padded(k) / 16) % blocks == 0;
  Kernel kernel = Kernel::builtin(device, khr ? "bitlinear_coopmat_khr" : "bitlinear_coopmat",
                                  {{0, ternary},
                                   {1, bias.has_value()},
                                   {2, out.y.has_value()},
                                   {3, out.accumulators.has_value()},
                                   {4, int64_t{tile_m}},
                                   {5, int64_t{tile_n}},
                                   {6, int64_t{blocks}},
                                   {7, int64_t{tile.subgroup_rows}},
                                   {8, int64_t{tile.depth}},
                                   {9, residual},
                                   {10, vector_rows},
                                   {11, full_tiles},
                                   {12, int64_t{split.splits}}});
  dispatch_tiles(sequence, kernel, {b.binding(), b.binding()}, a, false, m, n, k, tile_m, tile_n,
                 scales, gamma, bias, out, split);
}

// Only on request (bitlinear, ternary_matmul, int8_matmul), so never with a decoder's residual.
void record_coopmat2(Sequence& sequence, const Tensor& b, const PreparedRows& a, int64_t m,
                     int64_t n, int64_t k, bool ternary, const Tensor& scales, const Tensor& gamma,
                     const std::optional<Tensor>& bias, bool residual, const TiledOutputs& out) {
  if (residual) throw UnsupportedError("algorithm='coopmat2' adds no residual");
  const auto& device = b.device_ptr();
  const Coopmat2Tile tile = coopmat2_tile(m, n);
  Kernel kernel = Kernel::builtin(device, "bitlinear_coopmat2",
                                  {{0, ternary},
                                   {1, bias.has_value()},
                                   {2, out.y.has_value()},
                                   {3, out.accumulators.has_value()},
                                   {4, int64_t{tile.m}},
                                   {5, int64_t{tile.n}},
                                   {6, int64_t{tile.k}}});
  dispatch_tiles(sequence, kernel, {b.binding(), b.binding()}, a, false, m, n, k, tile.m, tile.n,
                 scales, gamma, bias, out);
}

// bias: [N], or with `residual` an [M, N] residual added element by element. group_cols: the
// output columns of all the matmuls recorded together with this one (0: n alone), which run at
// once on the GPU (no barrier between them), so the tensor-core tile is chosen for them all.
void record_matmul(BitLinearAlgorithm path, Sequence& sequence, const Tensor& b,
                   const PreparedRows& a, int64_t m, int64_t n, int64_t k, bool ternary,
                   const Tensor& scales, const Tensor& gamma, const std::optional<Tensor>& bias,
                   bool residual, const TiledOutputs& out, bool hardware, int64_t group_cols = 0) {
  if (path == BitLinearAlgorithm::coopmat || path == BitLinearAlgorithm::coopmat_khr)
    record_coopmat(sequence, b, a, m, n, k, ternary, scales, gamma, bias, residual, out,
                   path == BitLinearAlgorithm::coopmat_khr, group_cols ? group_cols : n);
  else if (path == BitLinearAlgorithm::coopmat2)
    record_coopmat2(sequence, b, a, m, n, k, ternary, scales, gamma, bias, residual, out);
  else
    record_tiled(sequence, b, a, m, n, k, ternary, scales, gamma, bias, residual, out, hardware);
}

// x [m, k] to interleaved int8 rows, their sums and their scales (bitlinear_prepare*.comp).
// The inputs the single-pass pre-pass can fuse in front of the quantization: relu(x)^2 * up, then
// an RMS norm (see bitlinear_prepare.comp; only for rows it keeps in registers).
struct FusedInput {
  const Tensor* up = nullptr;
  const Tensor* norm_weight = nullptr;
  float norm_eps = 0.0f;
  bool any() const { return up || norm_weight; }
};

void record_prepare(Sequence& sequence, const Tensor& x, int64_t m, int64_t k,
                    const PreparedRows& prepared, const Tensor& scales, const Tensor& nonfinite,
                    BitLinearAlgorithm algorithm, const FusedInput& fused = {}) {
  const auto& device = x.device_ptr();
  if (fused.any() || !split_prepare(k, algorithm)) {
    // The kernel's CACHED: 1 where rows are too long to hold (its loop path), which keeps that
    // path's registers few too.
    const int64_t cached = lane_vectors(k) <= kMostLaneVectors ? lane_vectors(k) : 1;
    // The tensor-core kernels take no row sums (no correction for unsigned codes): one barrier
    // a row fewer.
    const bool row_sums = algorithm != BitLinearAlgorithm::coopmat &&
                          algorithm != BitLinearAlgorithm::coopmat_khr &&
                          algorithm != BitLinearAlgorithm::coopmat2;
    Kernel prepare = Kernel::builtin(device, float_variant("bitlinear_prepare", x.dtype()),
                                     {{0, double{kEps}},
                                      {1, fused.norm_weight != nullptr},
                                      {2, fused.up != nullptr},
                                      {3, cached},
                                      {4, row_sums}});
    struct {
      uint32_t rows, k, padded_k;
      float norm_eps;
    } push{static_cast<uint32_t>(m), static_cast<uint32_t>(k), static_cast<uint32_t>(padded(k)),
           fused.norm_eps};
    BufferBinding bindings[] = {x.binding(),
                                x.binding(),
                                prepared.values.binding(),
                                scales.binding(),
                                prepared.row_sums.binding(),
                                nonfinite.binding(),
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
  BufferBinding bindings[] = {
      x.binding(),      partial.binding(),           prepared.values.binding(),
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
                   const Tensor& scales, int64_t m, const std::optional<Tensor>& bias,
                   bool residual, const Tensor& y, const std::optional<Tensor>& accumulators,
                   bool hardware) {
  const auto& device = y.device_ptr();
  const int64_t k = w.cols, n = w.rows;
  const uint32_t words = static_cast<uint32_t>(padded(k) / 16);
  const bool vectors = words % 4 == 0;
  const uint32_t rows = matvec_rows(m, k, n), unroll = matvec_unroll();
  Kernel kernel = Kernel::builtin(device, dot_variant("bitlinear_matvec", hardware),
                                  {{0, int64_t{m}},
                                   {1, int64_t{rows}},
                                   {2, bias.has_value()},
                                   {3, accumulators.has_value()},
                                   {4, vectors},
                                   {5, int64_t{unroll}},
                                   {6, residual}});
  // Each subgroup takes `rows` rows at a time; a workgroup one round of its subgroups.
  const uint32_t subgroups = subgroups_in(*device);
  const uint32_t rows_per_group = rows * subgroups;
  struct {
    uint32_t n, words_per_row, rows_per_group;
  } push{static_cast<uint32_t>(n), words, rows_per_group};
  const Tensor& acc = accumulators ? *accumulators : y;
  BufferBinding bindings[] = {w.packed.binding(),
                              w.packed.binding(),
                              prepared.values.binding(),
                              prepared.row_sums.binding(),
                              scales.binding(),
                              w.scales.binding(),
                              (bias ? *bias : w.scales).binding(),
                              y.binding(),
                              acc.binding()};
  const auto grid = checked_grid(
      *device, {(static_cast<uint64_t>(n) + rows_per_group - 1) / rows_per_group, 1, 1},
      "N = " + std::to_string(n));
  sequence.dispatch(kernel, grid, bindings, push_bytes(push));
}

// One dispatch for up to three weights sharing x (their outputs ys[i]); bias / residual and
// accumulators only with one weight. `grid`: see MatvecGrid (strided with one weight only).
// gated_out (two weights, gate and up, of one shape; whole 16-byte vectors): ys[0] = relu(gate)^2 *
// up.
void record_matvec_fused(Sequence& sequence, const std::vector<const QuantizedWeights*>& weights,
                         const Tensor& x, const FusedInput& fused, int64_t m,
                         const std::optional<Tensor>& bias, bool residual,
                         const std::vector<Tensor>& ys, const std::optional<Tensor>& accumulators,
                         const Tensor& nonfinite, bool hardware, bool gated_out = false,
                         MatvecGrid grid_shape = {}) {
  const auto& device = ys[0].device_ptr();
  const QuantizedWeights& w = *weights[0];
  const int64_t k = w.cols;
  const uint32_t words = static_cast<uint32_t>(padded(k) / 16);
  const uint32_t rows = gated_out ? 2 : matvec_rows(m, k, w.rows);
  const uint32_t subgroup_size = std::max<uint32_t>(1, device->info().subgroup_size);
  // With the first weights requested before the pre-pass, a lane requests all of its vectors of
  // a row at once (up to 4); without, up to 2 of each of two rows (the decode step's gate/up pair
  // and down_proj, docs/PERFORMANCE.md), and one of each where a subgroup takes more rows.
  const bool prefetch = matvec_prefetch(k, gated_out) && words % 4 == 0;
  const uint32_t row_vectors =  // a lane's vectors of a row
      std::clamp<uint32_t>((words / 4 + subgroup_size - 1) / subgroup_size, 1, 4);
  const uint32_t unroll = matvec_unroll(prefetch    ? row_vectors
                                        : rows == 2 ? std::min<uint32_t>(row_vectors, 2)
                                                    : 1);
  Kernel kernel = Kernel::builtin(device, dot_variant("bitlinear_matvec", hardware) + "_fused",
                                  {{0, int64_t{m}},
                                   {1, int64_t{rows}},
                                   {2, bias.has_value()},
                                   {3, accumulators.has_value()},
                                   {4, words % 4 == 0},
                                   {5, int64_t{unroll}},
                                   {6, residual},
                                   {7, fused.norm_weight != nullptr},
                                   {8, fused.up != nullptr},
                                   {9, int64_t{m * padded(k) / 4}},
                                   {10, lane_vectors(k, grid_shape.local_size)},
                                   {11, static_cast<int64_t>(weights.size())},
                                   {12, gated_out},
                                   {13, prefetch},
                                   {14, int64_t{grid_shape.local_size}},
                                   {15, grid_shape.groups > 0},
                                   {16, matvec_masked_codes(m, gated_out)}});
  const uint32_t subgroups = subgroups_in(*device, grid_shape.local_size);
  const uint32_t rows_per_group = subgroup_outputs(m, k, w.rows, gated_out) * subgroups;
  auto groups_of = [&](size_t i) {
    if (gated_out && i > 0) return uint64_t{0};
    return i < weights.size()
               ? (static_cast<uint64_t>(weights[i]->rows) + rows_per_group - 1) / rows_per_group
               : 0;
  };
  auto rows_of_weight = [&](size_t i) {
    return i < weights.size() ? static_cast<uint32_t>(weights[i]->rows) : 0u;
  };
  struct {
    uint32_t n, words_per_row, rows_per_group, k;
    float norm_eps, eps;
    uint32_t n_b, n_c, groups_a, groups_b;
  } push{rows_of_weight(0),
         words,
         rows_per_group,
         static_cast<uint32_t>(k),
         fused.norm_eps,
         static_cast<float>(kEps),
         rows_of_weight(1),
         rows_of_weight(2),
         static_cast<uint32_t>(groups_of(0)),
         static_cast<uint32_t>(groups_of(1))};
  auto weight = [&](size_t i) -> const QuantizedWeights& {
    return *weights[i < weights.size() ? i : 0];
  };
  auto out = [&](size_t i) -> const Tensor& { return ys[i < ys.size() ? i : 0]; };
  BufferBinding bindings[] = {w.packed.binding(),
                              w.packed.binding(),
                              x.binding(),
                              (fused.up ? *fused.up : x).binding(),
                              (fused.norm_weight ? *fused.norm_weight : x).binding(),
                              w.scales.binding(),
                              (bias ? *bias : w.scales).binding(),
                              ys[0].binding(),
                              (accumulators ? *accumulators : ys[0]).binding(),
                              nonfinite.binding(),
                              weight(1).packed.binding(),
                              weight(1).packed.binding(),
                              weight(1).scales.binding(),
                              out(1).binding(),
                              weight(2).packed.binding(),
                              weight(2).packed.binding(),
                              weight(2).scales.binding(),
                              out(2).binding()};
  const uint64_t groups =
      grid_shape.groups ? grid_shape.groups : groups_of(0) + groups_of(1) + groups_of(2);
  const auto grid = checked_grid(*device, {groups, 1, 1}, "N = " + std::to_string(w.rows));
  sequence.dispatch(kernel, grid, bindings, push_bytes(push));
}

// Weights with one scale per group along K (bitlinear_grouped.comp): y and the exact
// accumulators for any M, M_TILE activation rows a workgroup.
constexpr uint32_t kGroupedRows = 2;
void record_grouped(Sequence& sequence, const QuantizedWeights& w, const PreparedRows& prepared,
                    const Tensor& scales, int64_t m, const std::optional<Tensor>& bias,
                    const Tensor& y, const std::optional<Tensor>& accumulators, bool hardware) {
  const auto& device = y.device_ptr();
  const int64_t k = w.cols, n = w.rows;
  const uint32_t words = static_cast<uint32_t>(padded(k) / 16);
  const int64_t m_tile = std::min<int64_t>(m, kMatvecMaxRows);
  Kernel kernel = Kernel::builtin(device, dot_variant("bitlinear_grouped", hardware),
                                  {{0, m_tile},
                                   {1, bias.has_value()},
                                   {2, accumulators.has_value()},
                                   {3, w.group_size % 16 == 0},
                                   {4, w.group_size % 16 == 0 && words % 4 == 0},
                                   {5, int64_t{kGroupedRows}}});
  // kGroupedRows rows a subgroup at a time, one round of them a workgroup.
  const uint32_t subgroups = subgroups_in(*device);
  const uint32_t rows_per_group = kGroupedRows * subgroups;
  struct {
    uint32_t m, n, k, words_per_row, group, rows_per_group;
  } push{static_cast<uint32_t>(m),
         static_cast<uint32_t>(n),
         static_cast<uint32_t>(k),
         words,
         static_cast<uint32_t>(w.group_size),
         rows_per_group};
  const Tensor& acc = accumulators ? *accumulators : y;
  BufferBinding bindings[] = {w.packed.binding(),
                              prepared.values.binding(),
                              scales.binding(),
                              w.scales.binding(),
                              (bias ? *bias : w.scales).binding(),
                              y.binding(),
                              acc.binding(),
                              w.packed.binding()};
  const auto grid = checked_grid(*device,
                                 {(static_cast<uint64_t>(n) + rows_per_group - 1) / rows_per_group,
                                  static_cast<uint64_t>((m + m_tile - 1) / m_tile), 1},
                                 "x of " + std::to_string(m) + " rows by N = " + std::to_string(n));
  sequence.dispatch(kernel, grid, bindings, push_bytes(push));
}

// How bitlinear_group runs m rows of x (float32, K values) through `weights`: the algorithm, and
// where the matvec quantizes x itself, its grid (one dispatch for every weight).
struct GroupPath {
  BitLinearAlgorithm algorithm;
  std::optional<MatvecGrid> strided;
  bool fused = false;      // the matvec quantizes x itself, every weight in one dispatch
  bool gated_out = false;  // gated_output: that dispatch writes relu(gate)^2 * up itself
};

GroupPath group_path(const Tensor& x, int64_t m, int64_t k,
                     const std::vector<const QuantizedWeights*>& weights, bool any_residual,
                     bool gated_output, bool norm) {
  const Device& device = x.device();
  GroupPath path{matvec_takes(device, m) ? BitLinearAlgorithm::matvec
                                         : matmul_path(device, BitLinearAlgorithm::automatic)};
  // Up to three weights (q, k, v) in one dispatch, a residual only with one weight.
  const bool one_dispatch = weights.size() == 1 || (weights.size() <= 3 && !any_residual);
  // gated_output with whole 16-byte weight vectors: the dispatch writes relu(gate)^2 * up itself.
  const bool gated_out = gated_output && padded(k) % 64 == 0;
  if (path.algorithm != BitLinearAlgorithm::matvec) return path;
  if (!gated_output || gated_out)
    path.strided = strided_matvec(x, m, k, weights[0]->rows, weights.size(), gated_out, norm);
  path.fused = (path.strided || can_fuse_matvec(x, m, k)) && one_dispatch &&
               tuning().fused_matvec.value_or(true);
  path.gated_out = path.fused && gated_out;
  return path;
}

}  // namespace

bool gated_output_fuses(const Tensor& x, const QuantizedWeights& gate, bool norm) {
  const int64_t k = gate.cols;
  if (x.dtype() != DType::float32 || x.shape().empty() || x.shape().back() != k) return false;
  const int64_t m = static_cast<int64_t>(x.size()) / std::max<int64_t>(k, 1);
  return m > 0 && group_path(x, m, k, {&gate, &gate}, false, true, norm).gated_out;
}

std::vector<Tensor> bitlinear_group(const Tensor& x, const std::optional<Tensor>& up,
                                    const std::optional<Tensor>& norm_weight, double norm_eps,
                                    const std::vector<const QuantizedWeights*>& weights,
                                    const std::vector<std::optional<Tensor>>& residuals,
                                    bool gated_output) {
  require_float(x, "x");
  if (weights.empty()) throw ArgumentError("bitlinear_group: expected at least one weight");
  if (residuals.size() != weights.size())
    throw ArgumentError("bitlinear_group: expected one residual (or None) per weight");
  if (gated_output &&
      (weights.size() != 2 || residuals[0] || residuals[1] || weights[0]->rows != weights[1]->rows))
    throw ArgumentError(
        "bitlinear_group: gated_output takes two weights (gate, up) of one shape, no residuals");
  const int64_t k = weights[0]->cols;
  if (x.shape().empty() || x.shape().back() != k)
    throw ShapeError("x of shape " + shape_text(x.shape()) +
                     " does not match weights with K = " + std::to_string(k));
  const auto& device = x.device_ptr();
  if (up) {
    require_same_kind(x, "gate", *up, "up");
    if (up->shape() != x.shape())
      throw ShapeError("gate " + shape_text(x.shape()) + " and up " + shape_text(up->shape()) +
                       " differ in shape");
  }
  if (norm_weight &&
      (norm_weight->dtype() != DType::float32 || norm_weight->shape() != std::vector<int64_t>{k} ||
       &norm_weight->device() != device.get()))
    throw ShapeError("norm weight: expected float32 (" + std::to_string(k) +
                     ",) on x's device, got " + std::string(dtype_name(norm_weight->dtype())) +
                     " " + shape_text(norm_weight->shape()));
  const int64_t m = static_cast<int64_t>(x.size()) / std::max<int64_t>(k, 1);
  std::vector<std::vector<int64_t>> shapes;
  for (size_t i = 0; i < weights.size(); ++i) {
    const QuantizedWeights& w = *weights[i];
    require_ternary(w);
    if (w.cols != k)
      throw ShapeError("bitlinear_group: every weight must have K = " + std::to_string(k));
    if (&w.packed.device() != device.get())
      throw ArgumentError("x and the weights must live on one device");
    std::vector<int64_t> shape(x.shape().begin(), x.shape().end() - 1);
    shape.push_back(w.rows);
    if (residuals[i] && (residuals[i]->dtype() != DType::float32 || residuals[i]->shape() != shape))
      throw ShapeError("residual " + std::to_string(i) + ": expected float32 " + shape_text(shape) +
                       ", got " + std::string(dtype_name(residuals[i]->dtype())) + " " +
                       shape_text(residuals[i]->shape()));
    shapes.push_back(std::move(shape));
  }
  auto allocate = [&](size_t count) {
    std::vector<Tensor> tensors;
    for (size_t i = 0; i < count; ++i)
      tensors.push_back(Tensor::empty(device, shapes[i], DType::float32));
    return tensors;
  };
  // gated_output where the products were computed apart: the gating as its own op.
  auto finish = [&](std::vector<Tensor> outputs) {
    return gated_output
               ? std::vector<Tensor>{gated_activation(outputs[0], outputs[1], Activation::relu2)}
               : outputs;
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
    fused = {up ? &*up : nullptr, norm_weight ? &*norm_weight : nullptr,
             static_cast<float>(norm_eps)};
  } else {
    if (up) input = gated_activation(x, *up, Activation::relu2);
    if (norm_weight) input = row_op(input, RowOp::rms_norm, norm_weight, std::nullopt, norm_eps);
  }
  const bool any_residual =
      std::any_of(residuals.begin(), residuals.end(), [](const auto& r) { return r.has_value(); });
  const GroupPath path =
      group_path(input, m, k, weights, any_residual, gated_output, fused.norm_weight != nullptr);
  const BitLinearAlgorithm algorithm = path.algorithm;
  const bool hardware = use_hardware_dot(*device, std::nullopt);
  Recorder op(device);
  Sequence& sequence = op.sequence();
  // Every matvec workgroup quantizes the rows itself, saving the pre-pass's dispatch.
  if (path.fused) {
    std::vector<Tensor> outputs = allocate(path.gated_out ? 1 : weights.size());
    Tensor nonfinite = zeroed_counter(device);
    record_matvec_fused(sequence, weights, input, fused, m, residuals[0], residuals[0].has_value(),
                        outputs, std::nullopt, nonfinite, hardware, path.gated_out,
                        path.strided.value_or(MatvecGrid{}));
    op.run([nonfinite] { raise_if_nonfinite(nonfinite, "x"); });
    return path.gated_out ? outputs : finish(outputs);
  }
  std::vector<Tensor> outputs = allocate(weights.size());
  const auto [prepared, scales, nonfinite] = prepare_rows(sequence, input, m, k, algorithm, fused);
  // The tiled and tensor-core kernels add a residual in their epilogue (bit for bit a separate
  // add).
  int64_t group_cols = 0;
  for (const QuantizedWeights* w : weights) group_cols += w->rows;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (algorithm == BitLinearAlgorithm::matvec)
      record_matvec(sequence, *weights[i], prepared, scales, m, residuals[i],
                    residuals[i].has_value(), outputs[i], std::nullopt, hardware);
    else
      record_matmul(algorithm, sequence, weights[i]->packed, prepared, m, weights[i]->rows, k, true,
                    scales, weights[i]->scales, residuals[i], residuals[i].has_value(),
                    {outputs[i], std::nullopt}, hardware, group_cols);
  }
  op.run([nonfinite] { raise_if_nonfinite(nonfinite, "x"); });
  return finish(outputs);
}

BitLinearResult bitlinear(const Tensor& x, const QuantizedWeights& w,
                          const std::optional<Tensor>& bias, bool with_accumulators,
                          BitLinearAlgorithm algorithm, std::optional<bool> hardware_dot,
                          const std::optional<Tensor>& out_y,
                          const std::optional<Tensor>& out_accumulators) {
  require_ternary_any_scales(w);
  require_float(x, "x");
  if (x.shape().empty() || x.shape().back() != w.cols)
    throw ShapeError("x of shape " + shape_text(x.shape()) + " does not match weights of shape (" +
                     std::to_string(w.rows) + ", " + std::to_string(w.cols) +
                     "): K = " + std::to_string(w.cols) + " must be x's last axis");
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
  const std::initializer_list<const Tensor*> inputs{&x, &w.packed, &w.scales,
                                                    bias ? &*bias : nullptr};
  // y and the accumulators differ in dtype, so two targets can never be one tensor.
  BitLinearResult result{output(device, out_y, out_shape, DType::float32, "y", inputs),
                         std::nullopt};
  if (with_accumulators)
    result.accumulators =
        output(device, out_accumulators, out_shape, DType::int32, "accumulators", inputs);
  if (m == 0) return result;
  if (w.group_size != 0) {  // one scale per group: its own kernel, whatever M
    if (algorithm != BitLinearAlgorithm::automatic)
      throw UnsupportedError("weights with group_size=" + std::to_string(w.group_size) +
                             " run on their own kernel: leave algorithm unset");
    const bool hardware = use_hardware_dot(*device, hardware_dot);
    Recorder op_sequence(device);
    Sequence& sequence = op_sequence.sequence();
    const auto [prepared, scales, nonfinite] =
        prepare_rows(sequence, x, m, k, BitLinearAlgorithm::matvec);
    record_grouped(sequence, w, prepared, scales, m, bias, result.y, result.accumulators, hardware);
    op_sequence.run([nonfinite] { raise_if_nonfinite(nonfinite, "x"); });
    return result;
  }
  if (algorithm == BitLinearAlgorithm::automatic && matvec_takes(*device, m))
    algorithm = BitLinearAlgorithm::matvec;
  if (algorithm != BitLinearAlgorithm::matvec) algorithm = matmul_path(*device, algorithm);
  if (algorithm == BitLinearAlgorithm::matvec && m > kMatvecMaxRows)
    throw UnsupportedError("algorithm='matvec' handles up to " + std::to_string(kMatvecMaxRows) +
                           " rows; x has " + std::to_string(m));
  const bool hardware = use_hardware_dot(*device, hardware_dot);

  Recorder op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  // Few float32 rows that fit: every matvec workgroup quantizes them itself (no pre-pass dispatch).
  const auto strided =
      algorithm == BitLinearAlgorithm::matvec ? strided_matvec(x, m, k, n, 1) : std::nullopt;
  if (algorithm == BitLinearAlgorithm::matvec && (strided || can_fuse_matvec(x, m, k)) &&
      tuning().fused_matvec.value_or(true)) {
    Tensor nonfinite = zeroed_counter(device);
    record_matvec_fused(sequence, {&w}, x, {}, m, bias, false, {result.y}, result.accumulators,
                        nonfinite, hardware, false, strided.value_or(MatvecGrid{}));
    op_sequence.run([nonfinite] { raise_if_nonfinite(nonfinite, "x"); });
    return result;
  }
  const auto [prepared, scales, nonfinite] = prepare_rows(sequence, x, m, k, algorithm);
  if (algorithm == BitLinearAlgorithm::matvec) {
    record_matvec(sequence, w, prepared, scales, m, bias, false, result.y, result.accumulators,
                  hardware);
  } else {
    record_matmul(algorithm, sequence, w.packed, prepared, m, n, k, true, scales, w.scales, bias,
                  false, {result.y, result.accumulators}, hardware);
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
    Recorder op_zero(device);
    Sequence& zero = op_zero.sequence();
    zero.fill(out.binding(), 0);
    op_zero.run();
    return out;
  }
  const BitLinearAlgorithm path = matmul_path(*device, algorithm);
  const bool hardware = use_hardware_dot(*device, hardware_dot);
  Recorder op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  PreparedRows pa = interleave_int8(sequence, a, m, k, false);
  PreparedRows pb = interleave_int8(sequence, b, n, k, true);
  record_int8_products(sequence, pa.values, pb.values, out, path, hardware);
  op_sequence.run();
  return out;
}

void record_int8_products(Sequence& sequence, const Tensor& a, const Tensor& b,
                          const Tensor& products, BitLinearAlgorithm algorithm,
                          std::optional<bool> hardware_dot) {
  const auto& device = a.device_ptr();
  const int64_t m = a.shape()[0], n = b.shape()[0], k = a.shape()[1];
  // Row sums, scales and gamma: bound, not read, where the weights are int8 and y is not asked for.
  const Tensor unread = Tensor::empty(device, std::vector<int64_t>{m}, DType::int32);
  const PreparedRows rows{a, unread};
  record_matmul(matmul_path(*device, algorithm), sequence, b, rows, m, n, k, false, unread, unread,
                std::nullopt, false, {std::nullopt, products},
                use_hardware_dot(*device, hardware_dot));
}

Tensor ternary_matmul(const Tensor& a, const QuantizedWeights& w, BitLinearAlgorithm algorithm,
                      std::optional<bool> hardware_dot) {
  require_ternary_any_scales(w);  // the accumulators do not depend on the scales
  if (a.dtype() != DType::int8)
    throw DTypeError("a: expected int8, got " + std::string(dtype_name(a.dtype())));
  if (a.shape().size() != 2 || a.shape()[1] != w.cols)
    throw ShapeError("cannot multiply a of shape " + shape_text(a.shape()) +
                     " by weights of shape (" + std::to_string(w.rows) + ", " +
                     std::to_string(w.cols) + ")^T");
  const auto& device = a.device_ptr();
  const int64_t m = a.shape()[0], k = w.cols, n = w.rows;
  Tensor out = Tensor::empty(device, std::vector<int64_t>{m, n}, DType::int32);
  if (m == 0) return out;
  const BitLinearAlgorithm path = matmul_path(*device, algorithm);
  const bool hardware = use_hardware_dot(*device, hardware_dot);
  Recorder op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  PreparedRows pa = interleave_int8(sequence, a, m, k, false);
  record_matmul(path, sequence, w.packed, pa, m, n, k, true, w.scales, w.scales, std::nullopt,
                false, {std::nullopt, out}, hardware);
  op_sequence.run();
  return out;
}

Tensor bitlinear_backward_input(const Tensor& grad_y, const QuantizedWeights& w) {
  require_ternary_any_scales(w);
  if (grad_y.dtype() != DType::float32)
    throw DTypeError("grad_y: expected float32, got " + std::string(dtype_name(grad_y.dtype())));
  if (grad_y.shape().empty() || grad_y.shape().back() != w.rows)
    throw ShapeError("grad_y of shape " + shape_text(grad_y.shape()) +
                     " does not match weights of "
                     "shape (" +
                     std::to_string(w.rows) + ", " + std::to_string(w.cols) +
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
         static_cast<uint32_t>(padded(k) / 16),
         static_cast<uint32_t>(std::max<int64_t>(w.group_size, 1))};
  BufferBinding bindings[] = {w.packed.binding(), w.scales.binding(), grad_y.binding(),
                              out.binding()};
  Recorder op_sequence(device);
  Sequence& sequence = op_sequence.sequence();
  sequence.dispatch(kernel, {workgroups(*device, static_cast<uint64_t>(m * k)), 1, 1}, bindings,
                    push_bytes(push));
  op_sequence.run();
  return out;
}

}  // namespace bitnet::ops
