#include "server/version.h"

// Given by server/CMakeLists.txt to this file alone, so that a new version rebuilds one file.
#ifndef FERRY_PROJECT_VERSION
#error "FERRY_PROJECT_VERSION: compile this file with the project's version (server/CMakeLists.txt)"
#endif

namespace ferry {
const char* const kFerryVersion = FERRY_PROJECT_VERSION;
}  // namespace ferry
