#pragma once
// Small macros that keep absl::Status call sites flat.

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define FERRY_CONCAT_INNER_(a, b) a##b
#define FERRY_CONCAT_(a, b) FERRY_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the current function when it is not OK.
#define RETURN_IF_ERROR(expr)                  \
  do {                                         \
    ::absl::Status ferry_status_ = (expr);     \
    if (!ferry_status_.ok()) return ferry_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, MakeX());` declares x from a StatusOr or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(FERRY_CONCAT_(ferry_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()
