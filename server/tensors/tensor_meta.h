#pragma once
// The dtype contract both ends of a tensor transfer share: element sizes, names, and the
// byte span a (shape, strides) layout covers. Depends only on the proto, so the agent and
// the client libraries (C++ and Python) validate with the same rules.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "ferry/v1/tensor.pb.h"

namespace ferry::tensors {

// Bytes per element; 0 for DTYPE_UNSPECIFIED and values this build does not know.
uint32_t DTypeSize(ferry::v1::DType dtype);
// Lower-case name as numpy/torch spell it ("float32", "bfloat16", "float8_e4m3fn").
std::string DTypeName(ferry::v1::DType dtype);
// Inverse of DTypeName; also accepts the enum spelling ("DTYPE_FLOAT32"). INVALID_ARGUMENT
// naming the unknown value otherwise.
absl::StatusOr<ferry::v1::DType> ParseDType(const std::string& name);

// Checks dtype, shape and strides (`field` prefixes messages, e.g. "meta") and returns the
// bytes the tensor's span covers: from element 0 to one past its last element. Negative
// strides are refused: the span would start before element 0.
absl::StatusOr<uint64_t> TensorSpanBytes(const ferry::v1::TensorMeta& meta,
                                         const std::string& field);

// "[4, 1024] float32" for messages.
std::string DescribeTensor(const ferry::v1::TensorMeta& meta);
std::string DescribeShape(const ferry::v1::TensorMeta& meta);

// Device strings: "host" (or "" / "cpu") and "cuda:N". Returns the CUDA ordinal, -1 for host.
absl::StatusOr<int> ParseDevice(const std::string& device, const std::string& field);

}  // namespace ferry::tensors
