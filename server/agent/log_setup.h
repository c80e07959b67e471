#pragma once
// ferryd's log lines: level from `log.level`; `log.format` text (for people) or json (one
// object per line, for log pipelines: {"time","node","level","msg"}, the message escaped).
// Lines about a transfer start "transfer <id>:" in either format.

#include <string>

namespace ferry::server {

void SetUpLogging(const std::string& node, const std::string& level, const std::string& format);

// `text` as the inside of a JSON string (quotes, backslashes and control characters escaped).
std::string JsonEscape(const std::string& text);

}  // namespace ferry::server
