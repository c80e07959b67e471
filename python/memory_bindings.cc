// _ferry's calls for memory the Python process allocated itself and the block lists over it:
// register / deregister, prepare / release block lists, move blocks, and the transfer
// handles' poll, wait and cancel. Every call releases the GIL while it talks to the agent;
// move_blocks returns at once (the handle polls), so no thread waits for a transfer, unless
// the caller asked it to wait (one round trip for a few blocks).

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "python/py_session.h"

namespace py = pybind11;

namespace ferry::python {
namespace {

py::dict RegistrationDict(const v1::RegisterMemoryResponse& r) {
  py::dict d;
  d["id"] = r.buffer().id();
  d["name"] = r.buffer().name();
  d["size"] = r.buffer().size();
  d["device"] = r.buffer().device();
  d["backend"] = r.buffer().backend();
  d["existing"] = r.existing();
  return d;
}

const char* StateName(v1::TransferState s) {
  switch (s) {
    case v1::RUNNING: return "running";
    case v1::SUCCEEDED: return "succeeded";
    case v1::FAILED: return "failed";
    default: return "unknown";
  }
}

// A transfer's result as a handle keeps it ("failed": none listed).
py::dict ResultFields(const v1::TransferResult& r) {
  py::dict d;
  d["id"] = r.transfer_id();
  d["state"] = StateName(r.state());
  d["code"] = r.code();
  d["message"] = r.message();
  d["bytes"] = r.bytes();
  d["duration_us"] = r.duration_us();
  d["ops_total"] = r.ops_total();
  d["ops_failed"] = r.ops_failed();
  d["ops_succeeded"] = r.ops_succeeded();
  d["failed"] = py::list();
  return d;
}

// A transfer's result for a handle: its state, and with `failed` every failed op's index,
// code and message (the pages fetched one after another).
py::dict ResultDict(Session& s, uint64_t id, std::optional<double> wait_s, bool failed) {
  v1::TransferResult first;
  std::vector<v1::OpResult> failed_ops;
  absl::Status status;
  {
    py::gil_scoped_release release;
    v1::WaitRequest req;
    req.set_transfer_id(id);
    req.set_poll(!wait_s.has_value());
    // The agent answers RUNNING when `wait_s` passes; the call's own deadline is later.
    if (wait_s) req.set_wait_ms(static_cast<uint32_t>(std::clamp(*wait_s, 0.001, 3600.0) * 1000));
    req.set_include_ops(failed);
    req.set_failed_only(failed);
    while (true) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(wait_s.value_or(0)) +
                                          absl::Seconds(10)));
      s.client->session().Attach(&ctx);
      v1::TransferResult page;
      grpc::Status g = s.client->stub().Wait(&ctx, req, &page);
      if (!g.ok()) {
        status = absl::Status(static_cast<absl::StatusCode>(g.error_code()), g.error_message());
        break;
      }
      for (const auto& op : page.ops()) failed_ops.push_back(op);
      if (req.ops_from() == 0) first = page;
      if (!failed || page.ops_next() == 0 || page.state() == v1::RUNNING) break;
      req.set_ops_from(page.ops_next());
      req.set_poll(true);  // the later pages: it ended already
    }
  }
  Check(status);
  py::dict d = ResultFields(first);
  py::list indices;
  for (const auto& op : failed_ops) {
    indices.append(py::make_tuple(op.index(), op.code(), op.message()));
  }
  d["failed"] = indices;
  return d;
}

std::vector<uint64_t> Indices(
    const py::array_t<uint64_t, py::array::c_style | py::array::forcecast>& a, const char* field) {
  if (a.ndim() != 1) {
    throw StatusError(absl::InvalidArgumentError(absl::StrCat(field, ": must be one-dimensional")));
  }
  const uint64_t* p = a.data();
  return std::vector<uint64_t>(p, p + a.shape(0));
}

}  // namespace

void BindMemory(py::class_<Session, std::shared_ptr<Session>>& session) {
  session
      .def("register_memory",
           [](Session& s, uintptr_t address, uint64_t length, const std::string& name,
              const std::vector<std::string>& allowed_peers) {
             absl::StatusOr<v1::RegisterMemoryResponse> r;
             {
               py::gil_scoped_release release;
               r = s.client->RegisterMemory(reinterpret_cast<const void*>(address), length, name,
                                            allowed_peers);
             }
             return RegistrationDict(Take(std::move(r)));
           },
           py::arg("address"), py::arg("length"), py::arg("name") = "",
           py::arg("allowed_peers") = std::vector<std::string>{})
      .def("register_fd",
           [](Session& s, int fd, uint64_t offset, uint64_t length, const std::string& device,
              const std::string& name, const std::vector<std::string>& allowed_peers) {
             absl::StatusOr<v1::RegisterMemoryResponse> r;
             {
               py::gil_scoped_release release;
               r = s.client->RegisterFd(fd, offset, length, device, name, allowed_peers);
             }
             return RegistrationDict(Take(std::move(r)));
           },
           py::arg("fd"), py::arg("offset"), py::arg("length"), py::arg("device") = "host",
           py::arg("name") = "", py::arg("allowed_peers") = std::vector<std::string>{})
      .def("register_cuda_ipc",
           [](Session& s, py::bytes handle, uint64_t offset, uint64_t length,
              const std::string& device, const std::string& name,
              const std::vector<std::string>& allowed_peers) {
             std::string h = handle;
             absl::StatusOr<v1::RegisterMemoryResponse> r;
             {
               py::gil_scoped_release release;
               r = s.client->RegisterCudaIpc(h, offset, length, device, name, allowed_peers);
             }
             return RegistrationDict(Take(std::move(r)));
           },
           py::arg("handle"), py::arg("offset"), py::arg("length"), py::arg("device"),
           py::arg("name") = "", py::arg("allowed_peers") = std::vector<std::string>{})
      .def("deregister",
           [](Session& s, uint64_t id) {
             absl::Status st;
             {
               py::gil_scoped_release release;
               st = s.client->DeregisterMemory(id);
             }
             Check(st);
           })
      // extents: N x 4 (buffer, offset, block_bytes, count).
      .def("prepare_blocks",
           [](Session& s, py::array_t<uint64_t, py::array::c_style | py::array::forcecast> extents,
              const std::string& name) {
             // The fifth column, when there is one, is the stride (0: back to back).
             if (extents.ndim() != 2 || (extents.shape(1) != 4 && extents.shape(1) != 5)) {
               throw StatusError(absl::InvalidArgumentError(
                   "extents: must be N x 4 (buffer, offset, block_bytes, count) or N x 5 "
                   "(..., stride)"));
             }
             std::vector<v1::BlockExtent> list;
             list.reserve(extents.shape(0));
             const bool strided = extents.shape(1) == 5;
             auto v = extents.unchecked<2>();
             for (py::ssize_t i = 0; i < extents.shape(0); ++i) {
               list.push_back(
                   Extent(v(i, 0), v(i, 1), v(i, 2), v(i, 3), strided ? v(i, 4) : uint64_t{0}));
             }
             absl::StatusOr<v1::PrepareBlocksResponse> r;
             {
               py::gil_scoped_release release;
               r = s.blocks->Prepare(list, name);
             }
             auto resp = Take(std::move(r));
             return py::make_tuple(resp.list(), resp.blocks());
           },
           py::arg("extents"), py::arg("name") = "")
      .def("release_blocks",
           [](Session& s, uint64_t list) {
             absl::Status st;
             {
               py::gil_scoped_release release;
               st = s.blocks->Release(list);
             }
             Check(st);
           })
      // Returns (transfer id, bytes, None) once the transfer started; with `wait`, once it
      // ended, (transfer id, bytes, its result as transfer_result gives it).
      .def("move_blocks",
           [](Session& s, const std::string& type, uint64_t list,
              py::array_t<uint64_t, py::array::c_style | py::array::forcecast> local_ids,
              const std::string& peer, const std::string& remote_list,
              py::array_t<uint64_t, py::array::c_style | py::array::forcecast> remote_ids,
              const std::string& notify, uint32_t timeout_ms, bool verify, bool wait,
              const py::bytes& notify_payload) {
             if (type != "read" && type != "write") {
               throw StatusError(absl::InvalidArgumentError("type: must be 'read' or 'write'"));
             }
             std::vector<uint64_t> local = Indices(local_ids, "local_ids");
             std::vector<uint64_t> remote = Indices(remote_ids, "remote_ids");
             const std::string payload = notify_payload;
             absl::StatusOr<v1::MoveBlocksResponse> r;
             {
               py::gil_scoped_release release;
               r = s.blocks->Move(type == "read" ? v1::READ : v1::WRITE, list, local, peer,
                                  remote_list, remote, notify, timeout_ms, verify, wait, payload);
             }
             auto resp = Take(std::move(r));
             py::object result = py::none();
             if (wait) result = ResultFields(resp.result());
             return py::make_tuple(resp.transfer_id(), resp.bytes(), result);
           },
           py::arg("type"), py::arg("list"), py::arg("local_ids"), py::arg("peer"),
           py::arg("remote_list"), py::arg("remote_ids"), py::arg("notify") = "",
           py::arg("timeout_ms") = 0, py::arg("verify") = false, py::arg("wait") = false,
           py::arg("notify_payload") = py::bytes())
      // A notification alone to the owner of `peer`'s list `remote_list`; returns once the
      // peer's agent has it (Tensors.Notify).
      .def("notify",
           [](Session& s, const std::string& peer, const std::string& remote_list,
              const std::string& name, const py::bytes& payload, double timeout_s) {
             const std::string bytes = payload;
             absl::Status st;
             {
               py::gil_scoped_release release;
               st = s.blocks->Notify(peer, remote_list, name, bytes, absl::Seconds(timeout_s));
             }
             Check(st);
           },
           py::arg("peer"), py::arg("remote_list"), py::arg("name"),
           py::arg("payload") = py::bytes(), py::arg("timeout_s") = 10.0)
      // wait_s None: as it stands now (poll); else waits up to that many seconds.
      .def("transfer_result",
           [](Session& s, uint64_t id, std::optional<double> wait_s, bool failed) {
             return ResultDict(s, id, wait_s, failed);
           },
           py::arg("id"), py::arg("wait_s") = py::none(), py::arg("failed") = false)
      .def("cancel_transfer", [](Session& s, uint64_t id) {
        absl::Status st;
        {
          py::gil_scoped_release release;
          st = s.client->Cancel(id).status();
        }
        Check(st);
      });
}

}  // namespace ferry::python
