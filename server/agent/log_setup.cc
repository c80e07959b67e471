#include "server/agent/log_setup.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "base/json_writer.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/spdlog.h"

namespace ferry::server {
namespace {

// %* in a pattern: the message as the inside of a JSON string.
class JsonMessage : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const std::string escaped =
        JsonEscape(std::string(msg.payload.data(), msg.payload.size()));
    dest.append(escaped.data(), escaped.data() + escaped.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessage>();
  }
};

}  // namespace

std::string JsonEscape(const std::string& text) {
  std::string out;
  AppendJsonEscaped(out, text);
  return out;
}

void SetUpLogging(const std::string& node, const std::string& level, const std::string& format) {
  spdlog::set_level(spdlog::level::from_str(level));
  if (format != "json") {
    spdlog::set_pattern(absl::StrCat("%Y-%m-%d %H:%M:%S.%e ", node, " %^%l%$ %v"));
    return;
  }
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  // The node name is checked (no spaces, ':' or '/'); it is escaped all the same.
  formatter->add_flag<JsonMessage>('*').set_pattern(absl::StrCat(
      R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","node":")", JsonEscape(node),
      R"(","level":"%l","msg":"%*"})"));
  spdlog::set_formatter(std::move(formatter));
}

}  // namespace ferry::server
