#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace bitnet {

// The element types a Tensor can hold; names follow NumPy's.
enum class DType : uint8_t { float32, float16, int8, uint8, int32, uint32, float64 };

constexpr size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::float64:
      return 8;
    case DType::float32:
    case DType::int32:
    case DType::uint32:
      return 4;
    case DType::float16:
      return 2;
    case DType::int8:
    case DType::uint8:
      return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::float32:
      return "float32";
    case DType::float16:
      return "float16";
    case DType::int8:
      return "int8";
    case DType::uint8:
      return "uint8";
    case DType::int32:
      return "int32";
    case DType::uint32:
      return "uint32";
    case DType::float64:
      return "float64";
  }
  return "?";
}

inline constexpr DType all_dtypes[] = {DType::float32, DType::float16, DType::int8,   DType::uint8,
                                       DType::int32,   DType::uint32,  DType::float64};

constexpr std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType dtype : all_dtypes)
    if (dtype_name(dtype) == name) return dtype;
  return std::nullopt;
}

inline constexpr std::string_view supported_dtype_list =
    "float32, float16, int8, uint8, int32, uint32, float64";

}  // namespace bitnet
