#pragma once
// `ferryctl --json`: a proto message as JSON, the way protobuf's JSON printer writes it with
// preserve_proto_field_names and always_print_primitive_fields, except that 64-bit integers
// are JSON numbers. protobuf quotes them (a JavaScript double loses digits above 2^53), so
// `jq '.host_pool_bytes > 0'` would compare a string; scripts reading ferryctl (jq, Python)
// keep every digit of a bare number.

#include <string>

#include "google/protobuf/message.h"

namespace ferry::client {

// Every field under its proto name: scalars, strings and repeated fields even when empty or
// zero; message fields (and other fields with presence) only when set. Enums by name (the
// number if it has none), bytes as base64, maps as objects, NaN and infinities as the
// strings "NaN", "Infinity", "-Infinity". Fields in declaration order; no whitespace.
std::string ProtoToJson(const google::protobuf::Message& message);

}  // namespace ferry::client
