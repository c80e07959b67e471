#include "server/tensors/tensor_meta.h"

#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ferry::tensors {
namespace {

struct DTypeInfo {
  ferry::v1::DType dtype;
  const char* name;
  uint32_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {ferry::v1::DTYPE_FLOAT32, "float32", 4},
    {ferry::v1::DTYPE_FLOAT16, "float16", 2},
    {ferry::v1::DTYPE_BFLOAT16, "bfloat16", 2},
    {ferry::v1::DTYPE_INT8, "int8", 1},
    {ferry::v1::DTYPE_UINT8, "uint8", 1},
    {ferry::v1::DTYPE_INT32, "int32", 4},
    {ferry::v1::DTYPE_INT64, "int64", 8},
    {ferry::v1::DTYPE_FLOAT8_E4M3FN, "float8_e4m3fn", 1},
    {ferry::v1::DTYPE_FLOAT8_E5M2, "float8_e5m2", 1},
    {ferry::v1::DTYPE_FLOAT64, "float64", 8},
    {ferry::v1::DTYPE_INT16, "int16", 2},
    {ferry::v1::DTYPE_BOOL, "bool", 1},
};

const DTypeInfo* Find(ferry::v1::DType dtype) {
  for (const auto& d : kDTypes) {
    if (d.dtype == dtype) return &d;
  }
  return nullptr;
}

}  // namespace

uint32_t DTypeSize(ferry::v1::DType dtype) {
  const DTypeInfo* d = Find(dtype);
  return d ? d->size : 0;
}

std::string DTypeName(ferry::v1::DType dtype) {
  const DTypeInfo* d = Find(dtype);
  return d ? d->name : absl::StrCat("dtype(", static_cast<int>(dtype), ")");
}

absl::StatusOr<ferry::v1::DType> ParseDType(const std::string& name) {
  std::string lower = absl::AsciiStrToLower(name);
  if (lower.rfind("dtype_", 0) == 0) lower = lower.substr(6);
  // Common aliases users type.
  if (lower == "float" || lower == "f32") lower = "float32";
  if (lower == "half" || lower == "f16") lower = "float16";
  if (lower == "bf16") lower = "bfloat16";
  if (lower == "double") lower = "float64";
  if (lower == "long") lower = "int64";
  if (lower == "int") lower = "int32";
  for (const auto& d : kDTypes) {
    if (lower == d.name) return d.dtype;
  }
  std::vector<std::string> known;
  for (const auto& d : kDTypes) known.push_back(d.name);
  return absl::InvalidArgumentError(absl::StrCat("dtype: unknown dtype '", name, "' (known: ",
                                                 absl::StrJoin(known, ", "), ")"));
}

absl::StatusOr<uint64_t> TensorSpanBytes(const ferry::v1::TensorMeta& meta,
                                         const std::string& field) {
  uint32_t item = DTypeSize(meta.dtype());
  if (item == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".dtype: ", meta.dtype() == ferry::v1::DTYPE_UNSPECIFIED
                                            ? "must be set"
                                            : absl::StrCat("unknown dtype value ", meta.dtype())));
  }
  if (meta.shape_size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape: ", meta.shape_size(),
                                                   " dimensions is more than 64"));
  }
  if (meta.strides_size() != 0 && meta.strides_size() != meta.shape_size()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".strides: ", meta.strides_size(),
                                                   " strides for ", meta.shape_size(),
                                                   " dimensions"));
  }
  // Overflow-checked: a shape from the wire must not wrap into a small size.
  constexpr uint64_t kMax = std::numeric_limits<int64_t>::max();
  uint64_t numel = 1;
  for (int i = 0; i < meta.shape_size(); ++i) {
    int64_t dim = meta.shape(i);
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".shape[", i, "]: ", dim, " is negative"));
    }
    if (dim != 0 && numel > kMax / static_cast<uint64_t>(dim)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".shape: ", DescribeShape(meta),
                                                     " has too many elements"));
    }
    numel *= static_cast<uint64_t>(dim);
  }
  if (numel == 0) return 0;
  if (meta.strides_size() == 0) {
    if (numel > kMax / item) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".shape: ", DescribeShape(meta),
                                                     " is too large"));
    }
    return numel * item;
  }
  // Span of a strided layout: offset of the last element + 1.
  uint64_t last = 0;
  for (int i = 0; i < meta.shape_size(); ++i) {
    int64_t stride = meta.strides(i);
    if (stride < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".strides[", i, "]: ", stride, " is negative"));
    }
    uint64_t reach = static_cast<uint64_t>(meta.shape(i) - 1);
    if (stride != 0 && reach > (kMax - last) / static_cast<uint64_t>(stride)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".strides: the span is too large"));
    }
    last += reach * static_cast<uint64_t>(stride);
  }
  if (last + 1 > kMax / item) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".strides: the span is too large"));
  }
  return (last + 1) * item;
}

std::string DescribeShape(const ferry::v1::TensorMeta& meta) {
  return absl::StrCat("[", absl::StrJoin(meta.shape(), ", "), "]");
}

std::string DescribeTensor(const ferry::v1::TensorMeta& meta) {
  return absl::StrCat(DescribeShape(meta), " ", DTypeName(meta.dtype()));
}

absl::StatusOr<int> ParseDevice(const std::string& device, const std::string& field) {
  if (device.empty() || device == "host" || device == "cpu") return -1;
  if (device.rfind("cuda:", 0) == 0) {
    int ordinal = 0;
    if (absl::SimpleAtoi(device.substr(5), &ordinal) && ordinal >= 0) return ordinal;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": '", device, "' is not 'host' or 'cuda:N'"));
}

}  // namespace ferry::tensors
