#include "runtime/spirv_reflect.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "runtime/error.hpp"

namespace bitnet {
namespace {

// Opcodes, decorations and storage classes from the SPIR-V specification.
enum : uint32_t {
  OpEntryPoint = 15,
  OpExecutionMode = 16,
  OpExecutionModeId = 331,
  OpTypeBool = 20,
  OpTypeInt = 21,
  OpTypeFloat = 22,
  OpTypeVector = 23,
  OpTypeMatrix = 24,
  OpTypeArray = 28,
  OpTypeRuntimeArray = 29,
  OpTypeStruct = 30,
  OpTypePointer = 32,
  OpConstant = 43,
  OpSpecConstantTrue = 48,
  OpSpecConstantFalse = 49,
  OpSpecConstant = 50,
  OpSpecConstantComposite = 51,
  OpVariable = 59,
  OpDecorate = 71,
  OpMemberDecorate = 72,
};
enum : uint32_t {
  DecorationSpecId = 1,
  DecorationBlock = 2,
  DecorationBufferBlock = 3,
  DecorationArrayStride = 6,
  DecorationBuiltIn = 11,
  DecorationNonWritable = 24,
  DecorationBinding = 33,
  DecorationDescriptorSet = 34,
  DecorationOffset = 35,
  BuiltInWorkgroupSize = 25,
};
enum : uint32_t {
  StorageUniformConstant = 0,
  StorageUniform = 2,
  StoragePushConstant = 9,
  StorageStorageBuffer = 12,
  ModeLocalSize = 17,
  ModeLocalSizeId = 38,
  ModelGLCompute = 5,
};

struct Type {
  uint32_t opcode = 0;
  uint32_t width = 0;  // int/float bits
  bool is_signed = false;
  uint32_t element = 0;  // vector/matrix/array element, pointer pointee
  uint32_t count = 0;    // vector/matrix count, array length id
  uint32_t storage = 0;  // pointer storage class
  std::vector<uint32_t> members;
};

struct Module {
  std::unordered_map<uint32_t, Type> types;
  std::unordered_map<uint32_t, uint32_t> constants;                  // id -> value (32-bit)
  std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> spec;  // id -> (type, bits)
  std::unordered_map<uint32_t, std::vector<uint32_t>> composites;
  std::unordered_map<uint32_t, std::unordered_map<uint32_t, uint32_t>>
      decorations;  // id -> deco -> value
  std::unordered_map<uint64_t, std::unordered_map<uint32_t, uint32_t>> member_decorations;
  std::vector<std::pair<uint32_t, uint32_t>> variables;  // (pointer type, id)
};

uint64_t member_key(uint32_t id, uint32_t member) { return (uint64_t(id) << 32) | member; }

bool decorated(const Module& m, uint32_t id, uint32_t decoration) {
  auto found = m.decorations.find(id);
  return found != m.decorations.end() && found->second.count(decoration);
}

uint32_t type_size(const Module& m, uint32_t id, int depth = 0) {
  if (depth > 32) throw ArgumentError("SPIR-V type nesting is too deep");
  auto found = m.types.find(id);
  if (found == m.types.end()) throw ArgumentError("SPIR-V references an unknown type");
  const Type& type = found->second;
  switch (type.opcode) {
    case OpTypeBool:
      return 4;
    case OpTypeInt:
    case OpTypeFloat:
      return type.width / 8;
    case OpTypeVector:
    case OpTypeMatrix:
      return type.count * type_size(m, type.element, depth + 1);
    case OpTypeArray: {
      auto length = m.constants.find(type.count);
      uint32_t n = length == m.constants.end() ? 0 : length->second;
      auto stride = m.decorations.find(id);
      uint32_t element =
          stride != m.decorations.end() && stride->second.count(DecorationArrayStride)
              ? stride->second.at(DecorationArrayStride)
              : type_size(m, type.element, depth + 1);
      return n * element;
    }
    case OpTypeStruct: {
      uint32_t size = 0;
      for (uint32_t i = 0; i < type.members.size(); ++i) {
        auto decos = m.member_decorations.find(member_key(id, i));
        uint32_t offset =
            decos != m.member_decorations.end() && decos->second.count(DecorationOffset)
                ? decos->second.at(DecorationOffset)
                : size;
        size = std::max(size, offset + type_size(m, type.members[i], depth + 1));
      }
      return size;
    }
    default:
      return 0;
  }
}

std::string read_string(std::span<const uint32_t> words) {
  std::string text;
  for (uint32_t word : words)
    for (int byte = 0; byte < 4; ++byte) {
      char c = static_cast<char>((word >> (8 * byte)) & 0xff);
      if (c == '\0') return text;
      text.push_back(c);
    }
  return text;
}

}  // namespace

KernelInterface reflect_spirv(std::span<const uint32_t> words, std::string_view entry) {
  if (words.size() < 5 || words[0] != 0x07230203u)
    throw ArgumentError("not a SPIR-V module (expected the magic number 0x07230203 and a header)");
  Module m;
  KernelInterface interface;
  std::optional<uint32_t> entry_id;
  std::unordered_map<uint32_t, std::array<uint32_t, 3>> local_sizes;
  std::unordered_map<uint32_t, std::array<uint32_t, 3>> local_size_ids;  // SPIR-V 1.6's form

  for (size_t i = 5; i < words.size();) {
    const uint32_t opcode = words[i] & 0xffffu;
    const uint32_t count = words[i] >> 16;
    if (count == 0 || i + count > words.size())
      throw ArgumentError("malformed SPIR-V: instruction at word " + std::to_string(i) +
                          " runs past the end of the module");
    std::span<const uint32_t> op = words.subspan(i, count);
    switch (opcode) {
      case OpEntryPoint:
        if (count >= 4) {
          std::string name = read_string(op.subspan(3));
          if (op[1] == ModelGLCompute) {
            interface.entry_points.push_back(name);
            if (name == entry) entry_id = op[2];
          }
        }
        break;
      case OpExecutionMode:
        if (count >= 6 && op[2] == ModeLocalSize) local_sizes[op[1]] = {op[3], op[4], op[5]};
        break;
      case OpExecutionModeId:
        if (count >= 6 && op[2] == ModeLocalSizeId) local_size_ids[op[1]] = {op[3], op[4], op[5]};
        break;
      case OpTypeBool:
        m.types[op[1]] = Type{opcode};
        break;
      case OpTypeInt:
        if (count >= 4) m.types[op[1]] = Type{opcode, op[2], op[3] != 0};
        break;
      case OpTypeFloat:
        if (count >= 3) m.types[op[1]] = Type{opcode, op[2]};
        break;
      case OpTypeVector:
      case OpTypeMatrix:
      case OpTypeArray:
        if (count >= 4) m.types[op[1]] = Type{opcode, 0, false, op[2], op[3]};
        break;
      case OpTypeRuntimeArray:
        if (count >= 3) m.types[op[1]] = Type{opcode, 0, false, op[2]};
        break;
      case OpTypeStruct: {
        Type type{opcode};
        type.members.assign(op.begin() + 2, op.end());
        m.types[op[1]] = type;
        break;
      }
      case OpTypePointer:
        if (count >= 4) m.types[op[1]] = Type{opcode, 0, false, op[3], 0, op[2]};
        break;
      case OpConstant:
        if (count >= 4) m.constants[op[2]] = op[3];
        break;
      case OpSpecConstant:
        if (count >= 4) m.spec[op[2]] = {op[1], op[3]};
        break;
      case OpSpecConstantTrue:
      case OpSpecConstantFalse:
        if (count >= 3) m.spec[op[2]] = {op[1], opcode == OpSpecConstantTrue ? 1u : 0u};
        break;
      case OpSpecConstantComposite:
        if (count >= 3) m.composites[op[2]].assign(op.begin() + 3, op.end());
        break;
      case OpVariable:
        if (count >= 4) m.variables.push_back({op[1], op[2]});
        break;
      case OpDecorate:
        if (count >= 3) m.decorations[op[1]][op[2]] = count >= 4 ? op[3] : 1;
        break;
      case OpMemberDecorate:
        if (count >= 4)
          m.member_decorations[member_key(op[1], op[2])][op[3]] = count >= 5 ? op[4] : 1;
        break;
      default:
        break;
    }
    i += count;
  }

  if (!entry_id) {
    std::string names;
    for (const auto& name : interface.entry_points) names += (names.empty() ? "" : ", ") + name;
    throw ArgumentError("SPIR-V module has no compute entry point '" + std::string(entry) +
                        "' (compute entry points: " + (names.empty() ? "none" : names) + ")");
  }
  interface.entry = entry;
  if (auto size = local_sizes.find(*entry_id); size != local_sizes.end())
    interface.local_size = size->second;

  for (const auto& [id, spec] : m.spec) {
    auto decos = m.decorations.find(id);
    if (decos == m.decorations.end() || !decos->second.count(DecorationSpecId)) continue;
    const Type& type = m.types.at(spec.first);
    SpecType kind = type.opcode == OpTypeBool    ? SpecType::boolean
                    : type.opcode == OpTypeFloat ? SpecType::float32
                    : type.is_signed             ? SpecType::int32
                                                 : SpecType::uint32;
    interface.spec_constants[decos->second.at(DecorationSpecId)] = {kind, spec.second};
  }
  // local_size_x_id and friends: a spec-constant composite decorated BuiltIn WorkgroupSize
  // (SPIR-V before 1.6), or the entry point's LocalSizeId execution mode (1.6).
  const auto sized_by = [&](const std::vector<uint32_t>& parts) {
    for (int axis = 0; axis < 3; ++axis) {
      if (auto constant = m.constants.find(parts[axis]); constant != m.constants.end())
        interface.local_size[axis] = constant->second;
      auto part_decos = m.decorations.find(parts[axis]);
      if (part_decos != m.decorations.end() && part_decos->second.count(DecorationSpecId)) {
        interface.local_size_spec_ids[axis] = part_decos->second.at(DecorationSpecId);
        interface.local_size[axis] = m.spec.at(parts[axis]).second;
      }
    }
  };
  for (const auto& [id, parts] : m.composites) {
    auto decos = m.decorations.find(id);
    if (decos == m.decorations.end() || !decos->second.count(DecorationBuiltIn) ||
        decos->second.at(DecorationBuiltIn) != BuiltInWorkgroupSize || parts.size() != 3)
      continue;
    sized_by(parts);
  }
  if (auto ids = local_size_ids.find(*entry_id); ids != local_size_ids.end())
    sized_by({ids->second.begin(), ids->second.end()});

  std::map<uint32_t, bool> bindings;
  for (const auto& [pointer_type, id] : m.variables) {
    const Type& pointer = m.types.at(pointer_type);
    if (pointer.opcode != OpTypePointer) continue;
    const uint32_t storage = pointer.storage;
    if (storage == StoragePushConstant) {
      interface.push_constant_size = type_size(m, pointer.element);
      continue;
    }
    if (storage != StorageStorageBuffer && storage != StorageUniform &&
        storage != StorageUniformConstant)
      continue;
    const uint32_t pointee = pointer.element;
    const Type& block = m.types.at(pointee);
    const bool storage_buffer =
        storage == StorageStorageBuffer ||
        (storage == StorageUniform && decorated(m, pointee, DecorationBufferBlock));
    if (!storage_buffer || block.opcode != OpTypeStruct)
      throw UnsupportedError(
          "kernel declares a resource other than a storage buffer (uniform buffer, image, sampler "
          "or array of buffers); bitnet_gpu binds tensors as storage buffers only");
    auto decos = m.decorations.find(id);
    uint32_t set = 0, binding = 0;
    if (decos != m.decorations.end()) {
      if (decos->second.count(DecorationDescriptorSet))
        set = decos->second.at(DecorationDescriptorSet);
      if (decos->second.count(DecorationBinding)) binding = decos->second.at(DecorationBinding);
    }
    if (set != 0)
      throw UnsupportedError("kernel uses descriptor set " + std::to_string(set) +
                             "; bitnet_gpu binds tensors in set 0 only");
    bool read_only = decorated(m, id, DecorationNonWritable);
    if (!read_only && !block.members.empty()) {
      read_only = true;
      for (uint32_t i = 0; i < block.members.size(); ++i) {
        auto member = m.member_decorations.find(member_key(pointee, i));
        if (member == m.member_decorations.end() || !member->second.count(DecorationNonWritable))
          read_only = false;
      }
    }
    // Blocks may alias one binding (a float and a vec4 view of the same buffer): it is written
    // if any of them writes it.
    bindings[binding] = bindings[binding] || !read_only;
  }
  uint32_t expected = 0;
  for (const auto& [binding, writable] : bindings) {
    if (binding != expected)
      throw UnsupportedError(
          "kernel storage buffer bindings must be numbered 0..n-1 without gaps; "
          "binding " +
          std::to_string(expected) + " is missing");
    interface.binding_writable.push_back(writable);
    ++expected;
  }
  return interface;
}

}  // namespace bitnet
