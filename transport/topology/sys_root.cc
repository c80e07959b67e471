#include "transport/topology/sys_root.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ferry::topology {

SysRoot::SysRoot(std::string root) : root_(root.empty() ? "/" : std::move(root)) {
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
}

std::string SysRoot::Path(absl::string_view absolute) const {
  if (is_live()) return std::string(absolute);
  return absl::StrCat(root_, absolute);
}

bool SysRoot::Exists(absl::string_view absolute) const {
  std::error_code ec;
  return std::filesystem::exists(Path(absolute), ec);
}

std::optional<std::string> SysRoot::Read(absl::string_view absolute) const {
  std::ifstream in(Path(absolute), std::ios::binary);
  if (!in) return std::nullopt;
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return std::nullopt;
  return data;
}

std::optional<std::string> SysRoot::ReadLine(absl::string_view absolute) const {
  std::optional<std::string> data = Read(absolute);
  if (!data) return std::nullopt;
  std::string line = data->substr(0, data->find('\n'));
  return std::string(absl::StripAsciiWhitespace(line));
}

std::optional<std::string> SysRoot::LinkTarget(absl::string_view absolute) const {
  std::error_code ec;
  std::filesystem::path target = std::filesystem::read_symlink(Path(absolute), ec);
  if (ec) return std::nullopt;
  return target.string();
}

std::vector<std::string> SysRoot::List(absl::string_view absolute) const {
  std::vector<std::string> names;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(Path(absolute), ec), end; !ec && it != end;
       it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace ferry::topology
