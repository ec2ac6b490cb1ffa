#include "ops/bitlinear_paths.hpp"

#include <algorithm>
#include <iterator>

#include "ops/bitlinear.hpp"
#include "ops/dispatch.hpp"
#include "ops/tuning.hpp"
#include "runtime/device.hpp"
#include "runtime/error.hpp"

namespace bitnet::ops {
namespace {

bool has_tensor_cores(const Device& device) { return device.feature("cooperative_matrix_int8"); }
bool has_khr_tensor_cores(const Device& device) {
  return device.feature("cooperative_matrix_khr_int8");
}
bool has_coopmat2(const Device& device) { return device.feature("cooperative_matrix2_int8"); }

// An m x n tile with K steps of k, its subgroups 4 x 2 from 128 tile rows where the rows are whole
// multiples of 64 (else 2 x 4), loading two steps ahead.
CoopmatTile default_layout(uint32_t m, uint32_t n, uint32_t k) {
  return {m, n, k, m >= 128 && m % 64 == 0 ? 4u : 2u, 2};
}

}  // namespace

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

BitLinearAlgorithm matmul_path(const Device& device, BitLinearAlgorithm requested) {
  if (requested == BitLinearAlgorithm::coopmat && !has_tensor_cores(device))
    throw UnsupportedError(
        "algorithm='coopmat' needs int8 cooperative matrices "
        "(VK_NV_cooperative_matrix, 16x16x32 int8, subgroups of 32), which "
        "device '" +
        device.info().name + "' does not have");
  if (requested == BitLinearAlgorithm::coopmat_khr && !has_khr_tensor_cores(device))
    throw UnsupportedError(
        "algorithm='coopmat_khr' needs int8 cooperative matrices (VK_KHR_cooperative_matrix, "
        "16x16x32 int8, subgroups of 32, Vulkan 1.3), which device '" +
        device.info().name + "' does not have");
  if (requested == BitLinearAlgorithm::coopmat2 && !has_coopmat2(device))
    throw UnsupportedError(
        "algorithm='coopmat2' needs int8 cooperative matrices 2 (VK_NV_cooperative_matrix2 with "
        "workgroup scope and tensor addressing, int8 products for 256 invocations, Vulkan 1.3), "
        "which device '" +
        device.info().name + "' does not have");
  // Cooperative matrices 2 only on request: their kernel measured 2.3 to 3.5 times slower than
  // the NV cooperative-matrix one on the H100 (docs/PERFORMANCE.md), and every device with them
  // has that one too.
  if (requested == BitLinearAlgorithm::automatic || requested == BitLinearAlgorithm::matvec)
    return has_tensor_cores(device)       ? BitLinearAlgorithm::coopmat
           : has_khr_tensor_cores(device) ? BitLinearAlgorithm::coopmat_khr
                                          : BitLinearAlgorithm::tiled;
  return requested;
}

int64_t lane_vectors(int64_t k, int64_t local_size) {
  return (padded(k) / 4 + local_size - 1) / local_size;
}

bool can_fuse_input(int64_t k) { return k % 4 == 0 && lane_vectors(k) <= kMostLaneVectors; }

bool split_prepare(int64_t k, BitLinearAlgorithm algorithm) {
  if (k % 4 != 0 || k > int64_t{1} << 30) return false;
  if (auto forced = tuning().prepare_split) return *forced;
  // One workgroup a row leaves the GPU idle for a few long rows; it pays from K = 16384.
  return algorithm == BitLinearAlgorithm::matvec && k >= 12288;
}

uint32_t matvec_rows(int64_t m, int64_t k, int64_t n) {
  // Four rows hide more latency for long rows of few activations and for 4 to 8 activation rows
  // of large weights; more registers cost more elsewhere.
  const bool four = (k >= 8192 && m <= 4) || (m >= 4 && n * padded(k) >= (int64_t{1} << 24));
  return tuning().matvec_rows.value_or(four ? 4 : 2);
}

uint32_t subgroup_outputs(int64_t m, int64_t k, int64_t n, bool gated_out) {
  return gated_out ? 1 : matvec_rows(m, k, n);
}

uint32_t matvec_unroll(uint32_t fallback) { return tuning().matvec_unroll.value_or(fallback); }

bool matvec_prefetch(int64_t k, bool gated_out) {
  // Early weight requests pay for short rows; the gated output's long grid loses by them.
  return tuning().matvec_prefetch.value_or(k <= 4096 && !gated_out);
}

bool matvec_masked_codes(int64_t m, bool gated_out) {
  // Fewer instructions a weight word pays for one activation row; more rows run out of registers.
  return tuning().matvec_masked.value_or(m == 1 && !gated_out);
}

bool fused_matvec_fits(const Tensor& x, int64_t m, int64_t k, uint32_t local_size) {
  const Device& device = x.device();
  const auto& limits = device.limits();
  // The reduction scratch (bitlinear_matvec.comp): three arrays of local_size / 4 words (a word a
  // subgroup of 4 or more) for each row of x quantized at once, and a word an invocation.
  const int64_t cached = lane_vectors(k, local_size);
  const int64_t rows_at_once = std::min<int64_t>(m, cached <= 8 ? 8 / cached : 1);
  const int64_t scratch = 3 * rows_at_once * (local_size / 4) * 4 + 4 * int64_t{local_size};
  return x.dtype() == DType::float32 && k % 4 == 0 && cached <= kMostLaneVectors &&
         local_size <= limits.maxComputeWorkGroupInvocations &&
         local_size <= limits.maxComputeWorkGroupSize[0] &&
         subgroups_in(device, local_size) <= local_size / 4 &&
         m * padded(k) + scratch <= limits.maxComputeSharedMemorySize &&
         limits.maxPerStageDescriptorStorageBuffers >= 18;
}

bool can_fuse_matvec(const Tensor& x, int64_t m, int64_t k) {
  // One or two rows of up to 16384 values: past that every workgroup quantizing x again costs
  // more than the separate pre-pass's dispatch, as it did from three rows (docs/PERFORMANCE.md).
  const int64_t most = tuning().fused_matvec_most.value_or(m <= 2 ? 16384 : 0);
  return m * padded(k) <= most && fused_matvec_fits(x, m, k, 256);
}

std::optional<MatvecGrid> strided_matvec(const Tensor& x, int64_t m, int64_t k, int64_t n,
                                         size_t weights, bool gated_out, bool norm) {
  const Device& device = x.device();
  // For one or two rows of 6912 to 16384 values, or of fewer for 8192 rows of weights or more,
  // one round of large workgroups quantizing the rows once beats many small ones each quantizing
  // them again (docs/PERFORMANCE.md).
  const bool known = device.info().multiprocessors != 0;
  const int64_t weight_rows = gated_out ? 2 * n : n;
  const bool long_rows = known && m <= 2 && padded(k) >= 6912 && padded(k) <= 16384;
  const bool many_rows = known && m <= 2 && padded(k) < 6912 && weight_rows >= kStridedWeightRows;
  const uint32_t local_size =
      tuning().matvec_strided.value_or(long_rows   ? (padded(k) >= 12288 ? 1024 : 512)
                                       : many_rows ? 256
                                                   : 0);
  // A fused norm's sum of squares adds in an order that follows the local size: only at the
  // ordinary grid's 256 is it bit for bit the pre-pass's.
  if (local_size == 0 || weights != (gated_out ? 2u : 1u) || (norm && local_size != 256) ||
      !fused_matvec_fits(x, m, k, local_size))
    return std::nullopt;
  const uint32_t per_multiprocessor = tuning().matvec_strided_groups.value_or(1024 / local_size);
  // Where the multiprocessor count is unknown (lavapipe), a few workgroups.
  const uint64_t multiprocessors =
      device.info().multiprocessors ? device.info().multiprocessors : 4;
  const uint64_t fill = multiprocessors * per_multiprocessor;
  const uint64_t rows_per_round =
      uint64_t{subgroup_outputs(m, k, n, gated_out)} * subgroups_in(device, local_size);
  const uint64_t needed = (static_cast<uint64_t>(n) + rows_per_round - 1) / rows_per_round;
  return MatvecGrid{local_size,
                    static_cast<uint32_t>(std::max<uint64_t>(1, std::min(fill, needed)))};
}

CoopmatTile coopmat_tile(const Device& device, int64_t rows, int64_t cols) {
  // Where the multiprocessor count is unknown: 256 x 128 from m = 1024, else 64 x 128.
  CoopmatTile tile = default_layout(rows >= 1024 ? 256u : 64u, 128, 64);
  if (rows <= 64) {
    // A few rows (decode batches, verify steps): a subgroup's 16 rows each, K steps of 256 / tile
    // rows blocks so that every invocation loads one vector of x a step (their K split over
    // workgroups: coopmat_split). Tiles of 16 rows up to 16. From 17 rows, where the 128-column
    // tiles fill under two rounds of the multiprocessors (the decoder's projections), tiles of 32
    // rows, of 64 columns up to 32 rows (twice the tiles beat the wider tile's longer splits) and
    // two of them over 128 columns up to 64 (K steps of 128 cost less than the 64-row tile's steps
    // of 64); where they fill more (the screened head), one tile of 32 or 64 rows, which reads
    // the weights once (docs/PERFORMANCE.md).
    const uint32_t multiprocessors = device.info().multiprocessors;
    const bool many_tiles = multiprocessors != 0 && (cols + 127) / 128 >= 2 * multiprocessors;
    const uint32_t m = rows <= 16 ? 16 : rows <= 32 || !many_tiles ? 32 : 64;
    const uint32_t n = rows > 16 && rows <= 32 && !many_tiles ? 64 : 128;
    tile = {m, n, 4096 / m, m / 16, 2};
  } else if (const uint32_t multiprocessors = device.info().multiprocessors) {
    // Of the candidates the device's shared memory holds, the one with the least estimated time:
    // rounds of workgroups (one or two resident on each multiprocessor) times the tile's values
    // times a cost per value fitted on the H100, as a whole number of rounds matters more than the
    // tile.
    struct Candidate {
      CoopmatTile tile;
      uint32_t per_multiprocessor;
      double cost_per_value;
    };
    const Candidate candidates[] = {
        {{256, 128, 64, 4, 2}, 1, 1.0},   {{128, 128, 128, 4, 2}, 1, 1.05},
        {{64, 128, 128, 2, 2}, 1, 1.5},   {{128, 128, 64, 2, 1}, 2, 2.05},
        {{160, 128, 128, 2, 2}, 1, 1.11}, {{128, 96, 128, 4, 2}, 1, 1.3}};
    double best = -1.0;
    for (const Candidate& c : candidates) {
      if (c.tile.shared_bytes() > device.limits().maxComputeSharedMemorySize) continue;
      const uint64_t groups = static_cast<uint64_t>((rows + c.tile.m - 1) / c.tile.m) *
                              ((cols + c.tile.n - 1) / c.tile.n);
      const uint64_t slots = uint64_t{multiprocessors} * c.per_multiprocessor;
      const double estimate = static_cast<double>((groups + slots - 1) / slots) * c.tile.m *
                              c.tile.n * c.cost_per_value;
      if (best < 0.0 || estimate < best) {
        best = estimate;
        tile = c.tile;
      }
    }
  }
  const Tuning knobs = tuning();
  if (knobs.coopmat_tile)
    tile = default_layout(knobs.coopmat_tile->m, knobs.coopmat_tile->n, knobs.coopmat_tile->k);
  if (knobs.coopmat_depth) tile.depth = *knobs.coopmat_depth;
  if (knobs.coopmat_subgroup_rows) tile.subgroup_rows = *knobs.coopmat_subgroup_rows;
  const uint32_t r = tile.subgroup_rows;
  if (tile.m % (16 * r) || tile.n % (16 * (8 / r))) {
    const std::string shape = std::to_string(tile.m) + "x" + std::to_string(tile.n);
    if (knobs.coopmat_subgroup_rows)
      throw ArgumentError("coopmat_subgroup_rows=" + std::to_string(r) +
                          ": expected 1, 2, 4 or 8 splitting the " + shape +
                          " tile into multiples of 16");
    throw ArgumentError("coopmat_tile=" + shape + "x" + std::to_string(tile.k) +
                        ": its 8 subgroups split it " + std::to_string(r) + " x " +
                        std::to_string(8 / r) +
                        ", in parts that are not multiples of 16; set coopmat_subgroup_rows too");
  }
  return tile;
}

KSplit coopmat_split(const Device& device, const CoopmatTile& tile, int64_t m, int64_t n, int64_t k,
                     int64_t tiles) {
  const uint32_t step = tile.k / 16;
  const int64_t blocks = padded(k) / 16, steps = (blocks + step - 1) / step;
  uint32_t splits = 1;
  if (const auto forced = tuning().coopmat_splits) {
    splits = *forced;
  } else if (m <= 64) {
    // About one workgroup a multiprocessor (two where the count is unknown), each at least two K
    // steps where it can: a few tiles alone would run their whole K on a few multiprocessors,
    // and more splits than that cost more in their atomics and epilogue than their shorter K
    // loops save. Up to 16 rows (decode batches, verify steps), 4 splits measured faster than
    // that for every projection of the decoder's step. None where the tiles fill more than half
    // the multiprocessors (the decoder's gate/up pair, the screened head): there the splits'
    // atomics cost more than the K they share out (docs/PERFORMANCE.md).
    const int64_t multiprocessors =
        device.info().multiprocessors ? device.info().multiprocessors : 2;
    const int64_t wanted = 2 * tiles > multiprocessors ? 1
                           : m <= 16                   ? 4
                                     : (multiprocessors + tiles - 1) / std::max<int64_t>(tiles, 1);
    splits = static_cast<uint32_t>(std::clamp<int64_t>(std::min(wanted, steps / 2), 1, 64));
  }
  (void)n;
  const int64_t per_split = (steps + splits - 1) / std::max<uint32_t>(splits, 1);
  // Every split gets at least one step: the count that the steps a split take leave.
  splits = static_cast<uint32_t>((steps + per_split - 1) / per_split);
  return {splits, static_cast<uint32_t>(per_split * step)};
}

bool matvec_takes(const Device& device, int64_t m) {
  const bool tensor_cores = has_tensor_cores(device) || has_khr_tensor_cores(device);
  // Up to 5 rows the matvec (a pre-pass from 3) beats the tensor cores' K-split matmul in the
  // decode step; from 6 it no longer does (docs/PERFORMANCE.md).
  const int64_t most = tuning().matvec_most_rows.value_or(tensor_cores ? 5 : kMatvecMaxRows);
  return m <= most;
}

Coopmat2Tile coopmat2_tile(int64_t rows, int64_t) {
  // The fastest measured on the H100 (docs/PERFORMANCE.md): 64 x 64 up to 256 rows, 256 x 128
  // beyond, and 32 x 128 for a few rows.
  Coopmat2Tile tile = rows <= 32    ? Coopmat2Tile{32, 128, 64}
                      : rows <= 256 ? Coopmat2Tile{64, 64, 64}
                                    : Coopmat2Tile{256, 128, 64};
  if (const auto& knob = tuning().coopmat2_tile) tile = {knob->m, knob->n, knob->k};
  return tile;
}

}  // namespace bitnet::ops
