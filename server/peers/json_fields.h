#pragma once
// Reading JSON objects we do not own the schema of (etcd's gateway answers, the node records
// agents put in etcd) without a JSON library: protobuf's google.protobuf.Struct holds any
// JSON object, and these accessors read its fields leniently (absent = empty or zero).

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace ferry::server::json {

using google::protobuf::Struct;
using google::protobuf::Value;

// UNAVAILABLE naming `what` when `text` is not a JSON object (it came from elsewhere).
inline absl::StatusOr<Struct> ParseObject(const std::string& text, const std::string& what) {
  Struct out;
  auto parsed = google::protobuf::util::JsonStringToMessage(text, &out);
  if (!parsed.ok()) {
    return absl::UnavailableError(absl::StrCat(what, ": not a JSON object (",
                                               parsed.ToString(), "): '",
                                               text.substr(0, 128), "'"));
  }
  return out;
}

inline const Value* Field(const Struct& s, const std::string& name) {
  auto it = s.fields().find(name);
  return it == s.fields().end() ? nullptr : &it->second;
}

inline const Struct* Object(const Struct& s, const std::string& name) {
  const Value* v = Field(s, name);
  return v != nullptr && v->has_struct_value() ? &v->struct_value() : nullptr;
}

inline std::string Text(const Struct& s, const std::string& name) {
  const Value* v = Field(s, name);
  return v != nullptr && v->kind_case() == Value::kStringValue ? v->string_value() : "";
}

// A number, or a string of digits (how proto3 JSON writes 64-bit integers); 0 otherwise.
inline int64_t Int(const Struct& s, const std::string& name) {
  const Value* v = Field(s, name);
  if (v == nullptr) return 0;
  if (v->kind_case() == Value::kNumberValue) return static_cast<int64_t>(v->number_value());
  int64_t n = 0;
  return absl::SimpleAtoi(v->string_value(), &n) ? n : 0;
}

inline bool Flag(const Struct& s, const std::string& name) {
  const Value* v = Field(s, name);
  return v != nullptr && v->kind_case() == Value::kBoolValue && v->bool_value();
}

}  // namespace ferry::server::json
