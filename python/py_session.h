#pragma once
// What the binding files of _ferry share: the session object Python holds, and how a
// failed absl::Status becomes a ferry.errors exception (the module's translator raises the
// class matching the code).

#include <pybind11/pybind11.h>

#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "client/block_client.h"
#include "client/ferry_client.h"
#include "client/tensor_client.h"

namespace ferry::python {

// Carries an absl::Status to the translator, which raises the matching ferry.errors class.
struct StatusError : std::exception {
  explicit StatusError(absl::Status s) : status(std::move(s)) {}
  const char* what() const noexcept override { return "ferry status error"; }
  absl::Status status;
};

inline void Check(const absl::Status& s) {
  if (!s.ok()) throw StatusError(s);
}
template <typename T>
T Take(absl::StatusOr<T> s) {
  if (!s.ok()) throw StatusError(s.status());
  return *std::move(s);
}

// The clients of one agent session; buffers keep it alive so they can free themselves.
struct Session {
  std::unique_ptr<Client> client;
  std::unique_ptr<TensorClient> tensors;
  std::unique_ptr<BlockClient> blocks;
  std::string target;
};

// Session's calls for registered memory, block lists and transfer handles
// (python/memory_bindings.cc).
void BindMemory(pybind11::class_<Session, std::shared_ptr<Session>>& session);
// Session's one-sided transfers (run), buffer and policy listing (python/transfer_bindings.cc).
void BindTransfers(pybind11::class_<Session, std::shared_ptr<Session>>& session);

}  // namespace ferry::python
