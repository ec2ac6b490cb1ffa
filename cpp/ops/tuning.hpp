#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace bitnet::ops {

// A cooperative-matrix kernel's output tile and K step, as BITNET_GPU_COOPMAT_TILE=MxN[xK] gives
// it.
struct TileSetting {
  uint32_t m = 0, n = 0, k = 64;
  bool operator==(const TileSetting&) const = default;
};

// Every tuning knob of the ops, in one value. An unset knob (nullopt) leaves the choice to the
// op's own rule for the device and shape; docs/TUNING.md lists each with its environment variable.
struct Tuning {
  // BitLinear, few activation rows (bitlinear_matvec.comp).
  std::optional<bool> fused_matvec;           // quantize x inside the matvec where it fits
  std::optional<uint32_t> fused_matvec_most;  // the most values of x (M x K) a fused matvec takes
  std::optional<uint32_t> matvec_rows;        // output rows a subgroup computes together
  std::optional<uint32_t> matvec_unroll;      // vectors of a row a lane requests at once
  std::optional<bool> matvec_prefetch;        // request the first weights before the pre-pass
  std::optional<bool> matvec_masked;          // multiply the codes masked in place
  std::optional<uint32_t> matvec_strided;     // strided grid's local size (0: never)
  std::optional<uint32_t> matvec_strided_groups;  // strided grid's workgroups a multiprocessor
  std::optional<bool> prepare_split;              // spread the pre-pass over chunks of rows
  // BitLinear, many activation rows (bitlinear_coopmat.comp).
  std::optional<TileSetting> coopmat_tile;
  std::optional<uint32_t> coopmat_subgroup_rows;
  std::optional<uint32_t> coopmat_depth;
  std::optional<uint32_t> coopmat_splits;  // workgroups a tile's K is split over (1: none)
  // The most rows of x the matvec takes where tensor cores take the rest (the op's own rule).
  std::optional<uint32_t> matvec_most_rows;
  // BitLinear, many activation rows on cooperative matrices 2 (bitlinear_coopmat2.comp).
  std::optional<TileSetting> coopmat2_tile;
  // Attention.
  std::optional<bool> attention_split;          // split the keys over workgroups (few queries)
  std::optional<bool> attention_tiled;          // tiles of keys shared by blocks of queries
  std::optional<uint32_t> attention_tile_keys;  // keys a tile of attention_tiled
  std::optional<bool> fused_attention;          // rope, append and attention in one decode dispatch
  std::optional<uint32_t> decode_split;         // keys a decode_attention workgroup takes
  // The decoder's head.
  std::optional<uint32_t> head_in_flight;  // linear_rows' vectors a lane requests at once
  std::optional<uint32_t> screen_rows;     // head_screen's rows a subgroup requests at once
  std::optional<uint32_t> screen_groups;   // head_screen's workgroups a multiprocessor
  std::optional<uint32_t> verify_chunk;    // head_verify's rows a workgroup
  // Norms' backward pass.
  std::optional<uint32_t> norm_groups_per_sm;  // workgroups a multiprocessor for column sums
  // Python's small NumPy calls: repeated ones replay a recorded command buffer (the Python layer
  // reads it; python/bitnet_gpu/_recorded_calls.py).
  std::optional<bool> recorded_calls;
};

// The knobs in force: those set_tuning() gave, else the environment's, read once per process.
// ArgumentError naming the variable when one in the environment is malformed.
Tuning tuning();
// Replaces the knobs in force (every value checked first: ArgumentError naming the knob).
void set_tuning(const Tuning& tuning);
// The knobs the environment gives (BITNET_GPU_<NAME>), read now.
Tuning tuning_from_environment();

// A knob as Python and the documentation see it: its name, its environment variable, and the
// values it takes.
using KnobValue = std::variant<bool, int64_t, std::string>;
struct KnobInfo {
  std::string name;
  std::string variable;
  std::string values;  // "0 or 1", "1 to 16", "16, 32 or 64", "MxN or MxNxK"
};
const std::vector<KnobInfo>& tuning_knobs();
// A knob's value by name (nullopt: unset), and the tuning with one knob set or cleared; both
// ArgumentError for an unknown name or a value out of range.
std::optional<KnobValue> knob_value(const Tuning& tuning, const std::string& name);
Tuning with_knob(Tuning tuning, const std::string& name, const std::optional<KnobValue>& value);

}  // namespace bitnet::ops
