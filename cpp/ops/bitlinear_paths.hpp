#pragma once
// Which kernel a BitLinear call takes and the shape it runs in: the choices bitlinear.cpp records
// with. Each rule is the fastest measured on the H100 (docs/PERFORMANCE.md says which benchmark
// decides it); each can be overridden through Tuning (docs/TUNING.md).
#include <cstdint>
#include <optional>
#include <string>

#include "ops/bitlinear.hpp"
#include "runtime/tensor.hpp"

namespace bitnet {
class Device;
}

namespace bitnet::ops {

// K rounded up to whole 16-value blocks, as the kernels store rows.
inline int64_t padded(int64_t k) { return (k + 15) / 16 * 16; }

// The integer dot-product instructions where requested, else where the device says they are fast.
bool use_hardware_dot(const Device& device, std::optional<bool> requested);
// The built-in shader's name for the dot product chosen: base + "_dot" or "_int".
std::string dot_variant(const char* base, bool hardware);

// The matmul path for more than a few rows: tensor cores where the device has int8 cooperative
// matrices (VK_NV_cooperative_matrix), else the tiled integer-dot-product kernel; cooperative
// matrices 2 where requested.
BitLinearAlgorithm matmul_path(const Device& device, BitLinearAlgorithm requested);

// Vectors of 4 values each invocation of a workgroup of local_size holds for a row of k values
// (the pre-passes' and the fused matvec's CACHED), and the most they hold in registers.
int64_t lane_vectors(int64_t k, int64_t local_size = 256);
inline constexpr int64_t kMostLaneVectors = 16;
// Rows of weights from which one or two short rows of x take the strided matvec (local size 256).
inline constexpr int64_t kStridedWeightRows = 8192;
// Whether the pre-pass can fuse relu(x)^2 * up and an RMS norm in front of the quantization.
bool can_fuse_input(int64_t k);
// Whether the pre-pass for a few long rows is spread over chunks of rows (two dispatches).
bool split_prepare(int64_t k, BitLinearAlgorithm algorithm);

// Output rows a matvec subgroup computes together, and vectors of a row a lane requests at once.
uint32_t matvec_rows(int64_t m, int64_t k, int64_t n);
// Outputs a fused matvec subgroup takes at a time: matvec_rows, or with gated_out one (a gate and
// an up row).
uint32_t subgroup_outputs(int64_t m, int64_t k, int64_t n, bool gated_out);
uint32_t matvec_unroll(uint32_t fallback = 1);
// Whether a fused matvec requests its first weights before its pre-pass.
bool matvec_prefetch(int64_t k, bool gated_out);
// Whether a fused matvec multiplies the codes masked in place (bitlinear_matvec.comp's
// MASKED_CODES).
bool matvec_masked_codes(int64_t m, bool gated_out);

// A fused matvec's grid: `local_size` invocations a workgroup, and either one workgroup for each
// run of rows (groups == 0) or `groups` workgroups dealing the rows out to their subgroups in turn
// (the shader's STRIDED).
struct MatvecGrid {
  uint32_t local_size = 256;
  uint32_t groups = 0;
};
// Whether bitlinear_matvec.comp's FUSED variant, with workgroups of local_size, takes m float32
// rows of k values (registers, shared memory and its 18 storage buffers allowing).
bool fused_matvec_fits(const Tensor& x, int64_t m, int64_t k, uint32_t local_size);
// Whether every matvec workgroup quantizes x itself rather than a separate pre-pass doing it once.
bool can_fuse_matvec(const Tensor& x, int64_t m, int64_t k);
// The strided grid for one weight (or a gate/up pair with gated_out: n outputs from 2n rows) and
// a few long rows, or nullopt for the ordinary one; norm: with a fused norm.
std::optional<MatvecGrid> strided_matvec(const Tensor& x, int64_t m, int64_t k, int64_t n,
                                         size_t weights, bool gated_out = false, bool norm = false);

// The cooperative-matrix kernel's shape: its m x n output tile and K step, how its 8 subgroups
// split the tile (subgroup_rows x (8 / subgroup_rows) parts) and how many K steps it loads ahead.
struct CoopmatTile {
  uint32_t m = 128, n = 128, k = 64, subgroup_rows = 2, depth = 2;
  // The kernel's shared memory: both tiles of a K step in rows of K / 16 + 1 vectors of 16 bytes.
  uint64_t shared_bytes() const { return uint64_t{m + n} * (k / 16 + 1) * 16; }
};
CoopmatTile coopmat_tile(const Device& device, int64_t rows, int64_t cols);

// K split over workgroups (bitlinear_coopmat.glsl's SPLITS): `splits` workgroups a tile, each
// `blocks` blocks of 16 values of K (a multiple of the tile's K step), the last what is left.
struct KSplit {
  uint32_t splits = 1, blocks = 0;
};
// For an m x n x k matmul on `tile`, where its `tiles` output tiles (those of the matmuls recorded
// with it included) leave multiprocessors idle: about one workgroup a multiprocessor.
KSplit coopmat_split(const Device& device, const CoopmatTile& tile, int64_t m, int64_t n, int64_t k,
                     int64_t tiles);

// Whether `m` rows of x take the matvec (else a matmul path): up to kMatvecMaxRows without tensor
// cores; with them, up to 5 (the tensor cores, their K split, take the rest).
bool matvec_takes(const Device& device, int64_t m);

// The cooperative-matrix-2 kernel's tile for `rows` rows of x: rows of x (m), rows of the weights
// (n), K step (k).
struct Coopmat2Tile {
  uint32_t m = 128, n = 128, k = 64;
};
Coopmat2Tile coopmat2_tile(int64_t rows, int64_t cols);

}  // namespace bitnet::ops
