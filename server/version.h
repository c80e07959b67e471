#pragma once

namespace ferry {
inline constexpr const char* kFerryVersion = "0.1.0";
}  // namespace ferry
