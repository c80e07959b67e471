#include "client/proto_json.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/json_writer.h"
#include "google/protobuf/descriptor.h"

namespace ferry::client {
namespace {

using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

void WriteMessage(const Message& message, JsonWriter& json);

// protobuf's JSON spelling of the doubles JSON has no literal for.
void WriteDouble(double value, JsonWriter& json) {
  if (std::isnan(value)) {
    json.String("NaN");
  } else if (std::isinf(value)) {
    json.String(value > 0 ? "Infinity" : "-Infinity");
  } else {
    json.Double(value);
  }
}

// A float as its shortest float text (0.1f is 0.1, not 0.10000000149011612, as protobuf
// prints it): that text read as a double prints the same way.
void WriteFloat(float value, JsonWriter& json) {
  if (!std::isfinite(value)) return WriteDouble(value, json);
  char text[32];
  char* end = std::to_chars(text, text + sizeof(text), value).ptr;
  double shortest = value;
  (void)absl::SimpleAtod(absl::string_view(text, static_cast<size_t>(end - text)), &shortest);
  json.Double(shortest);
}

// One value of `field`: element `index` of a repeated field, or the singular value when
// `index` is -1.
void WriteValue(const Message& message, const FieldDescriptor* field, int index, JsonWriter& json) {
  const Reflection* r = message.GetReflection();
  const bool repeated = index >= 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      json.Int(repeated ? r->GetRepeatedInt32(message, field, index) : r->GetInt32(message, field));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      json.Int(repeated ? r->GetRepeatedInt64(message, field, index) : r->GetInt64(message, field));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      json.Uint(repeated ? r->GetRepeatedUInt32(message, field, index)
                         : r->GetUInt32(message, field));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      json.Uint(repeated ? r->GetRepeatedUInt64(message, field, index)
                         : r->GetUInt64(message, field));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      WriteDouble(
          repeated ? r->GetRepeatedDouble(message, field, index) : r->GetDouble(message, field),
          json);
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      WriteFloat(
          repeated ? r->GetRepeatedFloat(message, field, index) : r->GetFloat(message, field),
          json);
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      json.Bool(repeated ? r->GetRepeatedBool(message, field, index) : r->GetBool(message, field));
      break;
    case FieldDescriptor::CPPTYPE_ENUM: {
      // proto3 enums are open: a number this build has no name for is kept as the number.
      int number = repeated ? r->GetRepeatedEnumValue(message, field, index)
                            : r->GetEnumValue(message, field);
      const EnumValueDescriptor* value = field->enum_type()->FindValueByNumber(number);
      if (value != nullptr) {
        json.String(value->name());
      } else {
        json.Int(number);
      }
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string scratch;
      const std::string& text = repeated
                                    ? r->GetRepeatedStringReference(message, field, index, &scratch)
                                    : r->GetStringReference(message, field, &scratch);
      json.String(field->type() == FieldDescriptor::TYPE_BYTES ? absl::Base64Escape(text) : text);
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      WriteMessage(
          repeated ? r->GetRepeatedMessage(message, field, index) : r->GetMessage(message, field),
          json);
      break;
  }
}

// A map key as JSON wants it: always a string ("7", "true", "kv").
std::string MapKey(const Message& entry, const FieldDescriptor* key) {
  const Reflection* r = entry.GetReflection();
  switch (key->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(r->GetInt32(entry, key));
    case FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(r->GetInt64(entry, key));
    case FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrCat(r->GetUInt32(entry, key));
    case FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(r->GetUInt64(entry, key));
    case FieldDescriptor::CPPTYPE_BOOL:
      return r->GetBool(entry, key) ? "true" : "false";
    default:
      return r->GetString(entry, key);  // the only other key type proto allows
  }
}

void WriteRepeated(const Message& message, const FieldDescriptor* field, JsonWriter& json) {
  const Reflection* r = message.GetReflection();
  const int count = r->FieldSize(message, field);
  if (field->is_map()) {
    const FieldDescriptor* key = field->message_type()->map_key();
    const FieldDescriptor* value = field->message_type()->map_value();
    json.BeginObject();
    for (int i = 0; i < count; ++i) {
      const Message& entry = r->GetRepeatedMessage(message, field, i);
      json.Key(MapKey(entry, key));
      WriteValue(entry, value, -1, json);
    }
    json.EndObject();
    return;
  }
  json.BeginArray();
  for (int i = 0; i < count; ++i) WriteValue(message, field, i, json);
  json.EndArray();
}

// Well-known types (Timestamp, Any, wrappers) would need their own forms; ferry's protos
// use none, so they come out as plain messages.
void WriteMessage(const Message& message, JsonWriter& json) {
  const Reflection* r = message.GetReflection();
  const google::protobuf::Descriptor* descriptor = message.GetDescriptor();
  json.BeginObject();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    if (field->is_repeated()) {
      json.Key(field->name());
      WriteRepeated(message, field, json);
      continue;
    }
    // Fields with presence (messages, oneof members, proto3 `optional`) say "absent" by
    // being left out, as protobuf's printer does; the others print their value even when
    // it is the default.
    if (field->has_presence() && !r->HasField(message, field)) continue;
    json.Key(field->name());
    WriteValue(message, field, -1, json);
  }
  json.EndObject();
}

}  // namespace

std::string ProtoToJson(const Message& message) {
  JsonWriter json;
  WriteMessage(message, json);
  return json.str();
}

}  // namespace ferry::client
