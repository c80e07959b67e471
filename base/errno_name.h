#pragma once
// The symbolic name of an errno value ("ENOSYS"), for messages that must say which error a
// system or verbs call returned. Our own table: strerrorname_np needs glibc >= 2.32.

#include <string>

namespace ferry {

// "ENOMEM"; "errno 123" for a value the table does not know.
std::string ErrnoName(int err);

}  // namespace ferry
