// _ferry: the compiled half of the `ferry` Python package. Thin bindings over libferry's
// Client (buffers) and TensorClient (Send/Recv, blocks, notifications); the Pythonic API
// (numpy / torch, futures) lives in ferry/__init__.py. Every blocking call releases the GIL,
// and every error is raised as ferry.errors.Error carrying the gRPC status code and message.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/ferry_client.h"
#include "client/tensor_client.h"
#include "python/dlpack.h"
#include "server/tensors/tensor_meta.h"

namespace py = pybind11;

namespace ferry::python {
namespace {

// Carries an absl::Status to the translator, which raises the matching ferry.errors class.
struct StatusError : std::exception {
  explicit StatusError(absl::Status s) : status(std::move(s)) {}
  const char* what() const noexcept override { return "ferry status error"; }
  absl::Status status;
};

void Check(const absl::Status& s) {
  if (!s.ok()) throw StatusError(s);
}
template <typename T>
T Take(absl::StatusOr<T> s) {
  if (!s.ok()) throw StatusError(s.status());
  return *std::move(s);
}

CallOptions Options(double timeout_s, std::shared_ptr<CallCanceller> canceller) {
  CallOptions o;
  o.timeout = timeout_s > 0 ? absl::Seconds(timeout_s) : absl::Seconds(60);
  o.canceller = std::move(canceller);
  return o;
}

py::dict MetaDict(const v1::TensorMeta& meta) {
  py::dict d;
  d["dtype"] = tensors::DTypeName(meta.dtype());
  d["shape"] = py::tuple(py::cast(std::vector<int64_t>(meta.shape().begin(), meta.shape().end())));
  d["strides"] = py::tuple(py::cast(std::vector<int64_t>(meta.strides().begin(), meta.strides().end())));
  d["device"] = meta.device();
  d["tag"] = meta.tag();
  return d;
}

// Both clients of one agent; buffers keep it alive so they can free themselves.
struct Session {
  std::unique_ptr<Client> client;
  std::unique_ptr<TensorClient> tensors;
  std::string target;
};

// An agent buffer mapped into this process. Exposes its bytes through the buffer protocol
// (numpy: zero copy) and as DLPack capsules (torch: zero copy).
class PyBuffer {
 public:
  PyBuffer(std::shared_ptr<Session> session, std::unique_ptr<Buffer> buffer, bool owned)
      : session_(std::move(session)), buffer_(std::move(buffer)), owned_(owned) {}
  ~PyBuffer() {
    if (owned_ && !freed_) {
      // Best effort: the agent may already be gone at interpreter exit.
      py::gil_scoped_release release;
      session_->client->Free(buffer_->id()).IgnoreError();
    }
  }
  uint64_t id() const { return buffer_->id(); }
  const std::string& name() const { return buffer_->name(); }
  uint64_t size() const { return buffer_->size(); }
  std::string device() const {
    const std::string& d = buffer_->info().device();
    return d.empty() ? "host" : d;
  }
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(buffer_->data()); }
  bool owned() const { return owned_; }
  void set_owned(bool owned) { owned_ = owned; }
  void Free() {
    if (freed_) return;
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = session_->client->Free(buffer_->id());
    }
    freed_ = true;
    Check(s);
  }
  char* data() const { return buffer_->data(); }

 private:
  std::shared_ptr<Session> session_;
  std::unique_ptr<Buffer> buffer_;
  bool owned_;
  bool freed_ = false;
};

// What a DLPack consumer holds: the Python buffer object (so the mapping outlives the
// tensor) and the shape / strides arrays the DLTensor points into.
struct DLContext {
  py::object owner;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DLManagedTensor managed{};
};

void DeleteDLContext(DLManagedTensor* self) {
  auto* ctx = static_cast<DLContext*>(self->manager_ctx);
  // Consumers may call the deleter from any thread.
  py::gil_scoped_acquire gil;
  delete ctx;
}

DLDataType ToDLDataType(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32: return {kDLFloat, 32, 1};
    case v1::DTYPE_FLOAT16: return {kDLFloat, 16, 1};
    case v1::DTYPE_FLOAT64: return {kDLFloat, 64, 1};
    case v1::DTYPE_BFLOAT16: return {kDLBfloat, 16, 1};
    case v1::DTYPE_INT8: return {kDLInt, 8, 1};
    case v1::DTYPE_INT16: return {kDLInt, 16, 1};
    case v1::DTYPE_INT32: return {kDLInt, 32, 1};
    case v1::DTYPE_INT64: return {kDLInt, 64, 1};
    // torch 1.13 knows neither kDLBool nor float8: these travel as bytes, and ferry's
    // Python layer reinterprets them (tensor.view(torch.bool)).
    case v1::DTYPE_UINT8:
    case v1::DTYPE_BOOL:
    case v1::DTYPE_FLOAT8_E4M3FN:
    case v1::DTYPE_FLOAT8_E5M2: return {kDLUInt, 8, 1};
    default: throw StatusError(absl::InvalidArgumentError("dtype: not expressible in DLPack"));
  }
}

py::capsule MakeDLPack(py::object owner, const std::string& dtype_name,
                       const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                       uint64_t offset) {
  PyBuffer& buffer = owner.cast<PyBuffer&>();
  v1::TensorMeta meta;
  meta.set_dtype(Take(tensors::ParseDType(dtype_name)));
  for (int64_t d : shape) meta.add_shape(d);
  for (int64_t s : strides) meta.add_strides(s);
  uint64_t span = Take(tensors::TensorSpanBytes(meta, "tensor"));
  if (offset > buffer.size() || span > buffer.size() - offset) {
    throw StatusError(absl::OutOfRangeError(absl::StrCat(
        "tensor: ", tensors::DescribeTensor(meta), " at offset ", offset, " needs ", span,
        " bytes; buffer ", buffer.id(), " has ", buffer.size())));
  }
  int ordinal = Take(tensors::ParseDevice(buffer.device(), "device"));
  auto* ctx = new DLContext();
  ctx->owner = std::move(owner);
  ctx->shape = shape;
  ctx->strides = strides;
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = buffer.data();
  t.byte_offset = offset;
  // Ready for GPU pools: a "cuda:N" buffer becomes a kDLCUDA tensor on device N.
  t.device = ordinal < 0 ? DLDevice{kDLCPU, 0} : DLDevice{kDLCUDA, ordinal};
  t.ndim = static_cast<int32_t>(shape.size());
  t.dtype = ToDLDataType(meta.dtype());
  t.shape = ctx->shape.empty() ? nullptr : ctx->shape.data();
  t.strides = ctx->strides.empty() ? nullptr : ctx->strides.data();
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = DeleteDLContext;
  // Per the protocol: a consumer renames the capsule to "used_dltensor" and owns the
  // tensor; an unconsumed capsule frees it itself.
  return py::capsule(&ctx->managed, "dltensor", [](PyObject* cap) {
    if (PyCapsule_IsValid(cap, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
      if (m != nullptr && m->deleter != nullptr) m->deleter(m);
    }
  });
}

v1::TensorMeta BuildMeta(const std::string& dtype, const std::vector<int64_t>& shape,
                         const std::vector<int64_t>& strides, const std::string& device,
                         const std::string& tag) {
  v1::TensorMeta meta;
  meta.set_dtype(Take(tensors::ParseDType(dtype)));
  for (int64_t d : shape) meta.add_shape(d);
  for (int64_t s : strides) meta.add_strides(s);
  meta.set_device(device.empty() ? "host" : device);
  meta.set_tag(tag);
  return meta;
}

py::dict NotificationDict(const v1::Notification& n) {
  py::dict d;
  d["name"] = n.name();
  d["from_node"] = n.from_node();
  d["bytes"] = n.bytes();
  d["blocks"] = n.blocks();
  d["sequence"] = n.sequence();
  return d;
}

py::list PendingList(const google::protobuf::RepeatedPtrField<v1::PendingTensor>& items) {
  py::list out;
  for (const auto& p : items) {
    py::dict d;
    d["peer"] = p.peer();
    d["tag"] = p.tag();
    d["state"] = p.state();
    d["bytes"] = p.bytes();
    out.append(d);
  }
  return out;
}

std::shared_ptr<Session> Connect(const std::string& target, double timeout_s) {
  auto session = std::make_shared<Session>();
  session->target = target;
  absl::Duration timeout = absl::Seconds(timeout_s);
  {
    py::gil_scoped_release release;
    // One agent session for both: what this Python process allocates or receives is
    // freed when it closes the session or exits.
    auto opened = AgentSession::Open(target, timeout, "python");
    if (!opened.ok()) {
      py::gil_scoped_acquire gil;
      throw StatusError(opened.status());
    }
    session->client = std::make_unique<Client>(*opened);
    session->tensors = std::make_unique<TensorClient>(*opened);
  }
  return session;
}

}  // namespace

PYBIND11_MODULE(_ferry, m) {
  m.doc() = "ferry's compiled bindings; use the `ferry` package instead.";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      py::object err = py::module_::import("ferry.errors")
                           .attr("from_status")(static_cast<int>(e.status.code()),
                                                std::string(e.status.message()));
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
    }
  });

  m.def("dtype_size", [](const std::string& name) {
    return tensors::DTypeSize(Take(tensors::ParseDType(name)));
  });
  m.def("dtype_name", [](const std::string& name) {
    return tensors::DTypeName(Take(tensors::ParseDType(name)));
  });
  m.def("span_bytes", [](const std::string& dtype, const std::vector<int64_t>& shape,
                         const std::vector<int64_t>& strides) {
    return Take(tensors::TensorSpanBytes(BuildMeta(dtype, shape, strides, "host", "t"), "tensor"));
  });

  py::class_<CallCanceller, std::shared_ptr<CallCanceller>>(m, "Canceller")
      .def(py::init<>())
      .def("cancel", &CallCanceller::Cancel)
      .def_property_readonly("cancelled", &CallCanceller::cancelled);

  py::class_<PyBuffer, std::shared_ptr<PyBuffer>>(m, "Buffer", py::buffer_protocol())
      .def_property_readonly("id", &PyBuffer::id)
      .def_property_readonly("name", &PyBuffer::name)
      .def_property_readonly("size", &PyBuffer::size)
      .def_property_readonly("device", &PyBuffer::device)
      .def_property_readonly("address", &PyBuffer::address)
      .def_property("owned", &PyBuffer::owned, &PyBuffer::set_owned)
      .def("free", &PyBuffer::Free)
      .def("dlpack", [](py::object self, const std::string& dtype, const std::vector<int64_t>& shape,
                        const std::vector<int64_t>& strides, uint64_t offset) {
             return MakeDLPack(std::move(self), dtype, shape, strides, offset);
           },
           py::arg("dtype"), py::arg("shape"), py::arg("strides") = std::vector<int64_t>{},
           py::arg("offset") = 0)
      .def_buffer([](PyBuffer& b) {
        if (b.device() != "host") {
          throw StatusError(absl::FailedPreconditionError(
              absl::StrCat("buffer ", b.id(), " is on ", b.device(), "; use DLPack")));
        }
        return py::buffer_info(b.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.size())}, {1});
      });

  py::class_<NotificationStream>(m, "NotificationStream")
      .def("next", [](NotificationStream& s) -> py::object {
        absl::StatusOr<std::optional<v1::Notification>> n;
        {
          py::gil_scoped_release release;
          n = s.Next();
        }
        auto got = Take(std::move(n));
        if (!got) return py::none();
        return NotificationDict(*got);
      })
      .def("cancel", &NotificationStream::Cancel);

  py::class_<Session, std::shared_ptr<Session>>(m, "Session")
      .def(py::init(&Connect), py::arg("target"), py::arg("timeout") = 5.0)
      .def_readonly("target", &Session::target)
      .def("alloc", [](std::shared_ptr<Session> s, uint64_t size, const std::string& name) {
             absl::StatusOr<std::unique_ptr<Buffer>> b;
             {
               py::gil_scoped_release release;
               b = s->client->Alloc(size, name);
             }
             return std::make_shared<PyBuffer>(s, Take(std::move(b)), true);
           },
           py::arg("size"), py::arg("name") = "")
      .def("free", [](Session& s, uint64_t id) {
        absl::Status st;
        {
          py::gil_scoped_release release;
          st = s.client->Free(id);
        }
        Check(st);
      })
      .def("info", [](Session& s) {
        absl::StatusOr<v1::GetInfoResponse> info;
        {
          py::gil_scoped_release release;
          info = s.client->GetInfo();
        }
        auto i = Take(std::move(info));
        py::dict d;
        d["node"] = i.node();
        d["version"] = i.version();
        d["buffer_count"] = i.buffer_count();
        d["host_pool_bytes"] = i.host_pool_bytes();
        d["host_pool_used_bytes"] = i.host_pool_used_bytes();
        d["peers"] = std::vector<std::string>(i.peers().begin(), i.peers().end());
        return d;
      })
      .def("send",
           [](Session& s, uint64_t buffer, uint64_t offset, const std::string& dtype,
              const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
              const std::string& device, const std::string& peer, const std::string& tag,
              double timeout, std::shared_ptr<CallCanceller> canceller) {
             v1::TensorMeta meta = BuildMeta(dtype, shape, strides, device, tag);
             absl::StatusOr<v1::SendResponse> r;
             {
               py::gil_scoped_release release;
               r = s.tensors->Send(buffer, offset, meta, peer, Options(timeout, canceller));
             }
             auto resp = Take(std::move(r));
             py::dict d;
             d["bytes"] = resp.bytes();
             d["duration_us"] = resp.duration_us();
             d["landing_buffer"] = resp.landing_buffer();
             return d;
           },
           py::arg("buffer"), py::arg("offset"), py::arg("dtype"), py::arg("shape"),
           py::arg("strides"), py::arg("device"), py::arg("peer"), py::arg("tag"),
           py::arg("timeout"), py::arg("canceller") = nullptr)
      .def("recv",
           [](std::shared_ptr<Session> s, const std::string& peer, const std::string& tag,
              uint64_t buffer, uint64_t offset, const std::string& expect_dtype,
              std::optional<std::vector<int64_t>> expect_shape, double timeout,
              std::shared_ptr<CallCanceller> canceller) {
             RecvOptions recv;
             recv.buffer = buffer;
             recv.offset = offset;
             if (!expect_dtype.empty()) recv.expect.set_dtype(Take(tensors::ParseDType(expect_dtype)));
             if (expect_shape) {
               for (int64_t d : *expect_shape) recv.expect.add_shape(d);
             }
             absl::StatusOr<ReceivedTensor> r;
             {
               py::gil_scoped_release release;
               r = s->tensors->Recv(peer, tag, recv, Options(timeout, canceller));
             }
             ReceivedTensor got = Take(std::move(r));
             py::dict d;
             d["meta"] = MetaDict(got.meta);
             d["offset"] = got.offset;
             d["bytes"] = got.bytes;
             d["allocated"] = got.allocated;
             // A buffer the agent allocated belongs to the caller: freed when collected.
             d["buffer"] = got.buffer ? py::cast(std::make_shared<PyBuffer>(s, std::move(got.buffer),
                                                                           got.allocated))
                                      : py::none();
             return d;
           },
           py::arg("peer"), py::arg("tag"), py::arg("buffer") = 0, py::arg("offset") = 0,
           py::arg("expect_dtype") = "", py::arg("expect_shape") = py::none(),
           py::arg("timeout") = 60.0, py::arg("canceller") = nullptr)
      .def("write_blocks",
           [](Session& s, uint64_t local_buffer, const std::string& peer, const std::string& remote,
              py::array_t<uint64_t, py::array::c_style | py::array::forcecast> blocks,
              const std::string& notification, double timeout,
              std::shared_ptr<CallCanceller> canceller) {
             if (blocks.ndim() != 2 || blocks.shape(1) != 3) {
               throw StatusError(absl::InvalidArgumentError(
                   "blocks: must be N x 3 (local_offset, remote_offset, length)"));
             }
             std::vector<BlockSpec> specs(blocks.shape(0));
             auto v = blocks.unchecked<2>();
             for (py::ssize_t i = 0; i < blocks.shape(0); ++i) {
               specs[i] = {v(i, 0), v(i, 1), v(i, 2)};
             }
             absl::StatusOr<v1::WriteBlocksResponse> r;
             {
               py::gil_scoped_release release;
               r = s.tensors->WriteBlocks(local_buffer, peer, remote, specs, notification,
                                          Options(timeout, canceller));
             }
             auto resp = Take(std::move(r));
             py::dict d;
             d["bytes"] = resp.bytes();
             d["duration_us"] = resp.duration_us();
             return d;
           },
           py::arg("local_buffer"), py::arg("peer"), py::arg("remote_buffer"), py::arg("blocks"),
           py::arg("notification"), py::arg("timeout"), py::arg("canceller") = nullptr)
      .def("wait_notification",
           [](Session& s, const std::string& name, const std::string& from_node, double timeout,
              std::shared_ptr<CallCanceller> canceller) {
             absl::StatusOr<v1::Notification> n;
             {
               py::gil_scoped_release release;
               n = s.tensors->WaitNotification(name, from_node, Options(timeout, canceller));
             }
             return NotificationDict(Take(std::move(n)));
           },
           py::arg("name"), py::arg("from_node"), py::arg("timeout"),
           py::arg("canceller") = nullptr)
      .def("open_notifications",
           [](Session& s, const std::string& prefix, double timeout, uint32_t max_count) {
             return s.tensors->OpenNotifications(
                 prefix, timeout > 0 ? absl::Seconds(timeout) : absl::ZeroDuration(), max_count);
           },
           py::arg("prefix"), py::arg("timeout"), py::arg("max_count") = 0)
      .def("cancel", [](Session& s, const std::string& peer, const std::string& tag) {
        absl::StatusOr<v1::CancelResponse> r;
        {
          py::gil_scoped_release release;
          r = s.tensors->Cancel(peer, tag);
        }
        auto resp = Take(std::move(r));
        py::dict d;
        d["sends"] = resp.sends();
        d["recvs"] = resp.recvs();
        return d;
      })
      .def("pending", [](Session& s) {
        absl::StatusOr<v1::ListPendingResponse> r;
        {
          py::gil_scoped_release release;
          r = s.tensors->ListPending();
        }
        auto resp = Take(std::move(r));
        py::dict d;
        d["sends"] = PendingList(resp.sends());
        d["recvs"] = PendingList(resp.recvs());
        d["arrived"] = PendingList(resp.arrived());
        d["notifications"] = resp.notifications();
        return d;
      });
}

}  // namespace ferry::python
