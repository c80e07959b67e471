#pragma once
// The project's version, as ferryd --version, GetInfo, /metrics and ferryctl report it.
// Written in one place, CMakeLists.txt's project(), from which server/version.cc gets it
// (as libferry's <ferry/version.h> and the Python package do), so that they cannot differ.

namespace ferry {
extern const char* const kFerryVersion;
}  // namespace ferry
