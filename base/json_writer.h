#pragma once
// A tiny streaming JSON writer for `--json` outputs: objects, arrays, strings (escaped per
// RFC 8259), numbers, booleans and null. Commas are placed automatically; misuse (a value
// where a key is required) is a programming error caught by assert in debug builds.
// Header-only so any library can use it without another link dependency.

#include <cassert>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ferry {

// Appends `text` as the inside of a JSON string: quotes, backslashes and control characters
// escaped, UTF-8 passed through unchanged.
inline void AppendJsonEscaped(std::string& out, absl::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += "\\u00";
          out += kHex[(c >> 4) & 0xf];
          out += kHex[c & 0xf];
        } else {
          out += c;
        }
    }
  }
}

class JsonWriter {
 public:
  JsonWriter& BeginObject() { return Open('{', Scope::kObject); }
  JsonWriter& EndObject() { return Close('}', Scope::kObject); }
  JsonWriter& BeginArray() { return Open('[', Scope::kArray); }
  JsonWriter& EndArray() { return Close(']', Scope::kArray); }

  // Inside an object: the key of the next value.
  JsonWriter& Key(absl::string_view key) {
    assert(!stack_.empty() && stack_.back().scope == Scope::kObject && !key_pending_);
    Separate();
    AppendQuoted(key);
    out_ += ':';
    key_pending_ = true;
    return *this;
  }

  JsonWriter& String(absl::string_view value) {
    BeforeValue();
    AppendQuoted(value);
    return *this;
  }
  JsonWriter& Int(int64_t value) {
    BeforeValue();
    out_ += std::to_string(value);
    return *this;
  }
  JsonWriter& Uint(uint64_t value) {
    BeforeValue();
    out_ += std::to_string(value);
    return *this;
  }
  // Shortest text that reads back as the same double; NaN and infinities (not JSON)
  // become null.
  JsonWriter& Double(double value) {
    if (!std::isfinite(value)) return Null();
    BeforeValue();
    char buffer[32];
    auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
    out_.append(buffer, result.ptr);
    return *this;
  }
  JsonWriter& Bool(bool value) {
    BeforeValue();
    out_ += value ? "true" : "false";
    return *this;
  }
  JsonWriter& Null() {
    BeforeValue();
    out_ += "null";
    return *this;
  }
  // An int, or null when absent.
  JsonWriter& OptionalInt(std::optional<int64_t> value) {
    return value ? Int(*value) : Null();
  }
  JsonWriter& OptionalString(std::optional<absl::string_view> value) {
    return value ? String(*value) : Null();
  }

  // The text so far; complete once every scope is closed.
  const std::string& str() const { return out_; }
  bool complete() const { return stack_.empty() && !out_.empty(); }

  // `text` as a JSON string literal, quotes included.
  static std::string Quote(absl::string_view text) {
    JsonWriter writer;
    writer.AppendQuoted(text);
    return writer.out_;
  }

 private:
  enum class Scope { kObject, kArray };
  struct Level {
    Scope scope;
    bool has_items = false;
  };

  JsonWriter& Open(char bracket, Scope scope) {
    BeforeValue();
    out_ += bracket;
    stack_.push_back({scope});
    return *this;
  }
  JsonWriter& Close(char bracket, Scope scope) {
    assert(!stack_.empty() && stack_.back().scope == scope && !key_pending_);
    stack_.pop_back();
    out_ += bracket;
    return *this;
  }
  // Commas between members/elements.
  void Separate() {
    if (stack_.empty()) return;
    if (stack_.back().has_items) out_ += ',';
    stack_.back().has_items = true;
  }
  void BeforeValue() {
    if (key_pending_) {
      key_pending_ = false;
      return;
    }
    assert(stack_.empty() || stack_.back().scope == Scope::kArray);
    Separate();
  }
  void AppendQuoted(absl::string_view text) {
    out_ += '"';
    AppendJsonEscaped(out_, text);
    out_ += '"';
  }

  std::string out_;
  std::vector<Level> stack_;
  bool key_pending_ = false;
};

}  // namespace ferry
