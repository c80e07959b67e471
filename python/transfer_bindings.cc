// _ferry's one-sided transfers and listings: Session.run (a batch of WRITE / READ ops, as
// libferry's Client::Run), list_buffers and the policy calls. ferry/__init__.py builds
// read, write and run on these.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "python/py_session.h"

namespace py = pybind11;

namespace ferry::python {
namespace {

// (type, local buffer id, local offset, peer, remote buffer, remote offset, length); type 1
// is WRITE and 2 READ (ferry.v1.OpType), anything else reaches the agent to be refused.
using PyOp = std::tuple<int, uint64_t, uint64_t, std::string, std::string, uint64_t, uint64_t>;

py::list Strings(const google::protobuf::RepeatedPtrField<std::string>& values) {
  py::list out;
  for (const std::string& v : values) out.append(v);
  return out;
}

py::dict OpDict(const v1::OpResult& op) {
  py::dict d;
  d["index"] = op.index();
  d["code"] = op.code();
  d["message"] = op.message();
  d["bytes"] = op.bytes();
  d["provider"] = op.provider();
  d["duration_us"] = op.duration_us();
  py::list legs;
  for (const v1::Leg& leg : op.legs()) {
    py::dict l;
    l["side"] = leg.side();
    l["mode"] = leg.mode();
    l["device"] = leg.device();
    l["nic"] = leg.nic();
    l["path"] = leg.path();
    l["provider"] = leg.provider();
    l["bytes"] = leg.bytes();
    l["reason"] = leg.reason();
    l["rails"] = Strings(leg.rails());
    legs.append(std::move(l));
  }
  d["legs"] = std::move(legs);
  return d;
}

py::dict ResultDict(const v1::TransferResult& r) {
  py::dict d;
  d["transfer_id"] = r.transfer_id();
  d["state"] = v1::TransferState_Name(r.state());
  d["code"] = r.code();
  d["message"] = r.message();
  d["bytes"] = r.bytes();
  d["bytes_total"] = r.bytes_total();
  d["duration_us"] = r.duration_us();
  d["ops_total"] = r.ops_total();
  d["ops_failed"] = r.ops_failed();
  d["policy_generation"] = r.policy_generation();
  py::list ops;
  for (const v1::OpResult& op : r.ops()) ops.append(OpDict(op));
  d["ops"] = std::move(ops);
  return d;
}

py::dict BufferDict(const v1::BufferInfo& b) {
  py::dict d;
  d["id"] = b.id();
  d["name"] = b.name();
  d["size"] = b.size();
  d["device"] = b.device();
  d["backend"] = b.backend();
  d["owner"] = b.owner();
  d["persist"] = b.persist();
  d["registered"] = b.registered();
  d["allowed_peers"] = Strings(b.allowed_peers());
  return d;
}

py::dict PolicyDict(const v1::PolicyState& p) {
  py::dict d;
  d["generation"] = p.generation();
  d["gdr"] = p.gdr();
  d["gdr_max_path"] = p.gdr_max_path();
  d["fallback"] = p.fallback();
  d["staging_chunk_bytes"] = p.staging_chunk_bytes();
  d["staging_depth"] = p.staging_depth();
  py::dict overrides;
  for (const v1::PolicySetting& s : p.overrides()) overrides[py::str(s.key())] = s.value();
  d["overrides"] = std::move(overrides);
  return d;
}

}  // namespace

void BindTransfers(py::class_<Session, std::shared_ptr<Session>>& session) {
  session
      // A refusal of the batch (a field named) raises; a transfer that ran and failed
      // returns its result, whose code ferry/__init__.py turns into the exception.
      .def(
          "run",
          [](Session& s, const std::vector<PyOp>& py_ops, double timeout_s, bool include_ops) {
            std::vector<OpSpec> ops;
            ops.reserve(py_ops.size());
            for (const auto& [type, local, local_offset, peer, remote, remote_offset, length] :
                 py_ops) {
              ops.push_back(OpSpec{static_cast<v1::OpType>(type), local, local_offset, peer, remote,
                                   remote_offset, length});
            }
            absl::StatusOr<v1::TransferResult> result;
            {
              py::gil_scoped_release release;
              result = s.client->Run(ops, absl::Seconds(timeout_s), include_ops);
            }
            return ResultDict(Take(std::move(result)));
          },
          py::arg("ops"), py::arg("timeout") = 60.0, py::arg("include_ops") = false)
      .def("list_buffers",
           [](Session& s) {
             absl::StatusOr<std::vector<v1::BufferInfo>> buffers;
             {
               py::gil_scoped_release release;
               buffers = s.client->ListBuffers();
             }
             py::list out;
             for (const v1::BufferInfo& b : Take(std::move(buffers))) out.append(BufferDict(b));
             return out;
           })
      .def("get_policy",
           [](Session& s) {
             absl::StatusOr<v1::PolicyState> policy;
             {
               py::gil_scoped_release release;
               policy = s.client->GetPolicy();
             }
             return PolicyDict(Take(std::move(policy)));
           })
      .def(
          "set_policy",
          [](Session& s, const std::vector<std::pair<std::string, std::string>>& settings,
             bool clear_overrides) {
            absl::StatusOr<v1::PolicyState> policy;
            {
              py::gil_scoped_release release;
              policy = s.client->SetPolicy(settings, clear_overrides);
            }
            return PolicyDict(Take(std::move(policy)));
          },
          py::arg("settings"), py::arg("clear_overrides") = false);
}

}  // namespace ferry::python
