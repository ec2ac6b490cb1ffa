#include "ops/tuning.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "runtime/error.hpp"

namespace bitnet::ops {
namespace {

// M x K and N x K of a tile with whole vectors: each of a workgroup's 256 invocations loads whole
// 16-byte vectors of a K step's tiles (the tensor-core BitLinear kernel).
constexpr uint32_t kTileVectorValues = 256 * 16;

// How a knob's value is written and checked: a switch (0 or 1), a number in a range, one of a few
// numbers, or a tile MxN[xK].
struct Knob {
  const char* name;
  std::optional<bool> Tuning::*flag = nullptr;
  std::optional<uint32_t> Tuning::*number = nullptr;
  uint32_t least = 0, most = 0;
  std::vector<uint32_t> choices = {};
  std::optional<TileSetting> Tuning::*tile = nullptr;  // a tile MxN[xK], K one of tile_k
  std::vector<uint32_t> tile_k = {};
  uint32_t tile_step = 64;          // M and N: multiples of this up to 256
  bool tile_whole_vectors = false;  // M x K and N x K multiples of kTileVectorValues
};

std::vector<Knob> make_knobs() {
  return {
      {"fused_matvec", &Tuning::fused_matvec},
      {"fused_matvec_most", nullptr, &Tuning::fused_matvec_most, 1, 65536},
      {"matvec_rows", nullptr, &Tuning::matvec_rows, 1, 16},
      {"matvec_unroll", nullptr, &Tuning::matvec_unroll, 1, 4},
      {"matvec_prefetch", &Tuning::matvec_prefetch},
      {"matvec_masked", &Tuning::matvec_masked},
      {"matvec_strided", nullptr, &Tuning::matvec_strided, 0, 0, {0, 256, 512, 1024}},
      {"matvec_strided_groups", nullptr, &Tuning::matvec_strided_groups, 1, 8},
      {"prepare_split", &Tuning::prepare_split},
      {"coopmat_tile", nullptr, nullptr, 0, 0, {}, &Tuning::coopmat_tile, {64, 128, 256}, 16, true},
      {"coopmat_subgroup_rows", nullptr, &Tuning::coopmat_subgroup_rows, 0, 0, {1, 2, 4, 8}},
      {"coopmat_depth", nullptr, &Tuning::coopmat_depth, 1, 2},
      {"coopmat_splits", nullptr, &Tuning::coopmat_splits, 1, 64},
      {"matvec_most_rows", nullptr, &Tuning::matvec_most_rows, 1, 8},
      {"coopmat2_tile", nullptr, nullptr, 0, 0, {}, &Tuning::coopmat2_tile, {32, 64, 128}, 32},
      {"attention_split", &Tuning::attention_split},
      {"attention_tiled", &Tuning::attention_tiled},
      {"attention_tile_keys", nullptr, &Tuning::attention_tile_keys, 0, 0, {8, 16, 32}},
      {"fused_attention", &Tuning::fused_attention},
      {"decode_split", nullptr, &Tuning::decode_split, 0, 0, {16, 32, 64}},
      {"head_in_flight", nullptr, &Tuning::head_in_flight, 1, 8},
      {"screen_rows", nullptr, &Tuning::screen_rows, 1, 4},
      {"screen_groups", nullptr, &Tuning::screen_groups, 1, 16},
      {"verify_chunk", nullptr, &Tuning::verify_chunk, 1, 1024},
      {"norm_groups_per_sm", nullptr, &Tuning::norm_groups_per_sm, 1, 64},
      {"recorded_calls", &Tuning::recorded_calls},
  };
}

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> table = make_knobs();
  return table;
}

std::string variable_of(const char* name) {
  std::string variable = "BITNET_GPU_";
  for (const char* c = name; *c; ++c)
    variable += static_cast<char>(std::toupper(static_cast<unsigned char>(*c)));
  return variable;
}

// "8, 16 or 32".
std::string one_of(const std::vector<uint32_t>& values) {
  std::string text;
  for (size_t i = 0; i < values.size(); ++i)
    text += (i == 0 ? "" : i + 1 == values.size() ? " or " : ", ") + std::to_string(values[i]);
  return text;
}

std::string values_of(const Knob& knob) {
  if (knob.flag) return "0 or 1";
  if (knob.tile && knob.tile_whole_vectors) {
    // The multiple of M and N each K allows, from the first K's (up to 256) to the last's.
    std::string multiples;
    for (size_t i = 0; i < knob.tile_k.size(); ++i)
      multiples += (i == 0 ? "of " : ", of ") + std::to_string(kTileVectorValues / knob.tile_k[i]) +
                   (i == 0 ? " up to 256" : " with K " + std::to_string(knob.tile_k[i]));
    return "MxN or MxNxK (M and N multiples " + multiples + "; K " + one_of(knob.tile_k) + ")";
  }
  if (knob.tile)
    return "MxN or MxNxK (M and N multiples of " + std::to_string(knob.tile_step) +
           " up to 256, K " + one_of(knob.tile_k) + ")";
  if (knob.choices.empty()) return std::to_string(knob.least) + " to " + std::to_string(knob.most);
  return one_of(knob.choices);
}

const Knob& find_knob(const std::string& name) {
  for (const Knob& knob : knobs())
    if (name == knob.name) return knob;
  std::string known;
  for (const Knob& knob : knobs()) known += (known.empty() ? "" : ", ") + std::string(knob.name);
  throw ArgumentError("no tuning knob named '" + name + "' (knobs: " + known + ")");
}

std::optional<TileSetting> parse_tile(const std::string& text, const Knob& knob) {
  unsigned m = 0, n = 0, k = 64;
  char extra = 0;
  const int fields = std::sscanf(text.c_str(), "%ux%ux%u%c", &m, &n, &k, &extra);
  const uint32_t step = knob.tile_step;
  if (fields < 2 || fields > 3 || m == 0 || m % step || m > 256 || n == 0 || n % step || n > 256 ||
      std::find(knob.tile_k.begin(), knob.tile_k.end(), k) == knob.tile_k.end() ||
      (knob.tile_whole_vectors && ((m * k) % kTileVectorValues || (n * k) % kTileVectorValues)))
    return std::nullopt;
  return TileSetting{m, n, k};
}

// Sets `knob` in `tuning` from its text (the environment's form); `label` names it in errors.
void set_from_text(Tuning& tuning, const Knob& knob, const std::string& text,
                   const std::string& label) {
  const auto fail = [&] {
    throw ArgumentError(label + "=" + text + ": expected " + values_of(knob));
  };
  if (knob.tile) {
    auto tile = parse_tile(text, knob);
    if (!tile) fail();
    tuning.*knob.tile = tile;
    return;
  }
  unsigned value = 0;
  char extra = 0;
  if (std::sscanf(text.c_str(), "%u%c", &value, &extra) != 1 || text.empty() ||
      !std::isdigit(text[0]))
    fail();
  if (knob.flag) {
    if (value > 1) fail();
    tuning.*knob.flag = value == 1;
  } else if (!knob.choices.empty()) {
    if (std::find(knob.choices.begin(), knob.choices.end(), value) == knob.choices.end()) fail();
    tuning.*knob.number = value;
  } else {
    if (value < knob.least || value > knob.most) fail();
    tuning.*knob.number = value;
  }
}

std::mutex tuning_mutex;
std::optional<Tuning> current;

}  // namespace

Tuning tuning_from_environment() {
  Tuning tuning;
  for (const Knob& knob : knobs()) {
    const std::string variable = variable_of(knob.name);
    const char* text = std::getenv(variable.c_str());
    if (text && *text) set_from_text(tuning, knob, text, variable);
  }
  return tuning;
}

Tuning tuning() {
  std::lock_guard lock(tuning_mutex);
  if (!current) current = tuning_from_environment();
  return *current;
}

void set_tuning(const Tuning& tuning) {
  // Every value through its textual check, so the API takes what the environment takes.
  Tuning checked;
  for (const Knob& knob : knobs())
    checked = with_knob(checked, knob.name, knob_value(tuning, knob.name));
  std::lock_guard lock(tuning_mutex);
  current = checked;
}

const std::vector<KnobInfo>& tuning_knobs() {
  static const std::vector<KnobInfo> info = [] {
    std::vector<KnobInfo> list;
    for (const Knob& knob : knobs())
      list.push_back({knob.name, variable_of(knob.name), values_of(knob)});
    return list;
  }();
  return info;
}

std::optional<KnobValue> knob_value(const Tuning& tuning, const std::string& name) {
  const Knob& knob = find_knob(name);
  if (knob.tile) {
    if (!(tuning.*knob.tile)) return std::nullopt;
    const TileSetting& t = *(tuning.*knob.tile);
    return std::to_string(t.m) + "x" + std::to_string(t.n) + "x" + std::to_string(t.k);
  }
  if (knob.flag) {
    if (!(tuning.*knob.flag)) return std::nullopt;
    return *(tuning.*knob.flag);
  }
  if (!(tuning.*knob.number)) return std::nullopt;
  return static_cast<int64_t>(*(tuning.*knob.number));
}

Tuning with_knob(Tuning tuning, const std::string& name, const std::optional<KnobValue>& value) {
  const Knob& knob = find_knob(name);
  if (!value) {
    if (knob.tile)
      (tuning.*knob.tile).reset();
    else if (knob.flag)
      (tuning.*knob.flag).reset();
    else
      (tuning.*knob.number).reset();
    return tuning;
  }
  std::string text;
  if (const bool* b = std::get_if<bool>(&*value)) {
    if (!knob.flag)
      throw ArgumentError(name + "=" + (*b ? "True" : "False") + ": expected " + values_of(knob));
    text = *b ? "1" : "0";
  } else if (const int64_t* i = std::get_if<int64_t>(&*value)) {
    if (knob.tile || *i < 0 || *i > 0xFFFFFFFFll)
      throw ArgumentError(name + "=" + std::to_string(*i) + ": expected " + values_of(knob));
    text = std::to_string(*i);
  } else {
    text = std::get<std::string>(*value);
    if (!knob.tile) throw ArgumentError(name + "='" + text + "': expected " + values_of(knob));
  }
  set_from_text(tuning, knob, text, name);
  return tuning;
}

}  // namespace bitnet::ops
