// _ferry: the compiled half of the `ferry` Python package. Thin bindings over libferry's
// Client (buffers) and TensorClient (Send/Recv, blocks, notifications); the Pythonic API
// (numpy / torch, futures) lives in ferry/__init__.py. Every blocking call releases the GIL,
// and every error is raised as ferry.errors.Error carrying the gRPC status code and message.
//
// Send, Recv, WriteBlocks and WaitNotification run on gRPC's callback API and return a Call
// at once: no thread waits for any of them. Python either waits on the Call (the blocking
// forms, in slices so that Ctrl-C is seen) or gives it a Completions queue and a key (the
// futures: one Python thread per client drains the queue and completes them).

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/agent_channel.h"
#include "client/ferry_client.h"
#include "client/tensor_client.h"
#include "python/dlpack.h"
#include "python/py_session.h"
#include "server/tensors/tensor_meta.h"

namespace py = pybind11;

namespace ferry::python {
namespace {


// `timeout_s`: seconds; None waits without limit (the agent gets the largest timeout_ms its
// uint32 field holds, about 49.7 days); zero or less: the default 60 s.
CallOptions Options(std::optional<double> timeout_s, std::shared_ptr<CallCanceller> canceller) {
  CallOptions o;
  if (!timeout_s) {
    o.timeout = absl::InfiniteDuration();
  } else {
    o.timeout = *timeout_s > 0 ? absl::Seconds(*timeout_s) : absl::Seconds(60);
  }
  o.canceller = std::move(canceller);
  return o;
}

py::dict MetaDict(const v1::TensorMeta& meta) {
  py::dict d;
  d["dtype"] = tensors::DTypeName(meta.dtype());
  d["shape"] = py::tuple(py::cast(std::vector<int64_t>(meta.shape().begin(), meta.shape().end())));
  d["strides"] =
      py::tuple(py::cast(std::vector<int64_t>(meta.strides().begin(), meta.strides().end())));
  d["device"] = meta.device();
  d["tag"] = meta.tag();
  return d;
}


// An agent buffer mapped into this process. Exposes its bytes through the buffer protocol
// (numpy: zero copy) and as DLPack capsules (torch: zero copy).
class PyBuffer {
 public:
  PyBuffer(std::shared_ptr<Session> session, std::unique_ptr<Buffer> buffer, bool owned)
      : session_(std::move(session)), buffer_(std::move(buffer)), owned_(owned) {}
  ~PyBuffer() {
    // A session that ended (the agent went away) took its buffers with it.
    if (owned_ && !freed_ && session_->client->session().alive()) {
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
  // "host", "cuda" or "sim": a simulated GPU's memory is host memory in this process.
  std::string backend() const { return buffer_->info().backend(); }
  // What the CPU here can address: host buffers and simulated GPUs' (numpy, the buffer
  // protocol); CUDA memory only through DLPack.
  bool cpu_addressable() const { return device() == "host" || backend() == "sim"; }
  uintptr_t address() const { return reinterpret_cast<uintptr_t>(buffer_->data()); }
  bool owned() const { return owned_; }
  void set_owned(bool owned) { owned_ = owned; }
  void Free() {
    if (freed_) return;
    if (!session_->client->session().alive()) {
      throw StatusError(absl::FailedPreconditionError(absl::StrCat(
          "buffer ", id(), ": its session ended (", session_->client->session().ended().message(),
          "): the agent went away or restarted, and freed it")));
    }
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = session_->client->Free(buffer_->id());
    }
    freed_ = true;
    Check(s);
  }
  char* data() const { return buffer_->data(); }
  // The session it was allocated or received in (Python tells an old agent run's buffers).
  const std::shared_ptr<Session>& session() const { return session_; }

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
  // A simulated GPU's buffer is host memory here: a CPU tensor (torch has no such GPU).
  t.device = ordinal < 0 || buffer.cpu_addressable() ? DLDevice{kDLCPU, 0}
                                                      : DLDevice{kDLCUDA, ordinal};
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
  d["code"] = n.code();
  d["message"] = n.message();
  d["sequence"] = n.sequence();
  d["list"] = n.list();
  d["buffer"] = n.buffer();
  d["payload"] = py::bytes(n.payload());
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

// --- results: what the calls return to Python -------------------------------------------

py::object SendResult(const std::shared_ptr<Session>&, v1::SendResponse resp) {
  py::dict d;
  d["bytes"] = resp.bytes();
  d["duration_us"] = resp.duration_us();
  d["landing_buffer"] = resp.landing_buffer();
  return d;
}

py::object RecvResult(const std::shared_ptr<Session>& s, ReceivedTensor got) {
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
}

py::object WriteBlocksResult(const std::shared_ptr<Session>&, v1::WriteBlocksResponse resp) {
  py::dict d;
  d["bytes"] = resp.bytes();
  d["duration_us"] = resp.duration_us();
  return d;
}

py::object NotificationResult(const std::shared_ptr<Session>&, v1::Notification n) {
  return NotificationDict(n);
}

// --- calls in flight ----------------------------------------------------------------------

// How long a blocking call waits with the GIL released before it lets Python handle
// signals: Ctrl-C interrupts a call within about this much.
constexpr absl::Duration kSignalSlice = absl::Milliseconds(50);

// The keys of async calls that ended, for the one Python thread per client that completes
// their futures (ferry.Client's _Completer). gRPC's threads only push here: they never wait
// for the GIL, so a busy interpreter does not hold up every other call's completion.
class Completions {
 public:
  void Push(uint64_t key) {
    absl::MutexLock lock(&mu_);
    keys_.push_back(key);
  }
  // The keys pushed since the last call, waiting for one if there are none; empty once
  // closed. Waits with the GIL released.
  std::vector<uint64_t> Next() {
    py::gil_scoped_release release;
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &Completions::ReadyLocked));
    return std::exchange(keys_, {});
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

 private:
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || !keys_.empty(); }

  absl::Mutex mu_;
  std::vector<uint64_t> keys_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// One call in flight, shared by the gRPC callback that ends it and the Python Call that
// waits for it. It holds no Python object: the callback runs without the GIL.
class CallState {
 public:
  // Makes the call's Python result, under the GIL, from what the agent answered.
  using Build = absl::AnyInvocable<py::object(const std::shared_ptr<Session>&) &&>;

  // `completions` (may be null: a blocking call) learns `key` when the call ends.
  CallState(std::shared_ptr<Completions> completions, uint64_t key)
      : completions_(std::move(completions)), key_(key) {}

  // Run once by the completion callback, on any thread, without the GIL.
  void End(absl::Status status, Build build) {
    {
      absl::MutexLock lock(&mu_);
      status_ = std::move(status);
      build_ = std::move(build);
      done_ = true;
    }
    if (completions_) completions_->Push(key_);
  }
  // True once the call ended; waits for that until `deadline` (call without the GIL).
  bool WaitUntil(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(absl::Condition(&done_), deadline);
    return done_;
  }
  bool done() const {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  // The outcome of an ended call; the builder only to the first caller.
  std::pair<absl::Status, Build> Take() {
    absl::MutexLock lock(&mu_);
    return {status_, std::move(build_)};
  }
  const std::shared_ptr<CallCanceller>& canceller() const { return canceller_; }

 private:
  const std::shared_ptr<Completions> completions_;
  const uint64_t key_;
  const std::shared_ptr<CallCanceller> canceller_ = std::make_shared<CallCanceller>();
  mutable absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  Build build_ ABSL_GUARDED_BY(mu_);
};

// The CallDone that ends `state` with the result `to_python` will make of the answer.
template <typename T>
CallDone<T> EndState(std::shared_ptr<CallState> state,
                     py::object (*to_python)(const std::shared_ptr<Session>&, T)) {
  return [state = std::move(state), to_python](absl::StatusOr<T> r) mutable {
    if (!r.ok()) {
      state->End(r.status(), nullptr);
      return;
    }
    state->End(absl::OkStatus(), [value = *std::move(r), to_python](
                                     const std::shared_ptr<Session>& s) mutable {
      return to_python(s, std::move(value));
    });
  };
}

// Waits until `wait_until(deadline)` says it is done or `until` passed; false then. The wait
// is cut into kSignalSlice pieces with the GIL released; between them Python runs its signal
// handlers, and if one raises (KeyboardInterrupt) `cancel` cancels what was waited for and
// the exception propagates. Call with the GIL held.
template <typename WaitUntil, typename Cancel>
bool WaitInSlices(absl::Time until, WaitUntil wait_until, Cancel cancel) {
  while (true) {
    bool done;
    {
      py::gil_scoped_release release;
      done = wait_until(std::min(until, absl::Now() + kSignalSlice));
    }
    if (done) return true;
    if (PyErr_CheckSignals() != 0) {
      cancel();
      throw py::error_already_set();
    }
    if (absl::Now() >= until) return false;
  }
}

// A timeout from Python as a point in time: seconds, or None (no limit).
absl::Time Until(std::optional<double> timeout_s) {
  if (!timeout_s) return absl::InfiniteFuture();
  return absl::Now() + absl::Seconds(std::max(*timeout_s, 0.0));
}

// A call as Python sees it (_ferry.Call): wait() / result() wait for it, cancel() cancels it
// at the agent. It keeps the session alive while the call runs.
class PyCall {
 public:
  PyCall(std::shared_ptr<Session> session, std::shared_ptr<CallState> state)
      : session_(std::move(session)), state_(std::move(state)) {}

  // Waits up to `timeout_s` seconds (None: without limit); true when the call ended. Ctrl-C
  // cancels the call at the agent and raises KeyboardInterrupt (see WaitInSlices).
  bool Wait(std::optional<double> timeout_s) {
    return WaitInSlices(
        Until(timeout_s), [this](absl::Time t) { return state_->WaitUntil(t); },
        [this] { state_->canceller()->Cancel(); });
  }

  // What the blocking call returns, once it ended (waits as Wait(None)); raises its error.
  // The same object each time: a landing buffer must have one owner.
  py::object Result() {
    Wait(std::nullopt);
    if (!result_) {
      auto [status, build] = state_->Take();
      if (!status.ok()) throw StatusError(std::move(status));
      if (!build) throw StatusError(absl::InternalError("call: its result could not be made"));
      result_ = std::move(build)(session_);
    }
    return result_;
  }

  bool done() const { return state_->done(); }
  void Cancel() { state_->canceller()->Cancel(); }

 private:
  std::shared_ptr<Session> session_;
  std::shared_ptr<CallState> state_;
  py::object result_;
};

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
    session->blocks = std::make_unique<BlockClient>(session->client.get());
  }
  return session;
}

}  // namespace

PYBIND11_MODULE(_ferry, m) {
  m.doc() = "ferry's compiled bindings; use the `ferry` package instead.";
  // The project's version (CMakeLists.txt), which ferry.__version__ reports.
  m.attr("__version__") = FERRY_VERSION;

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

  // The one rule libferry and ferryctl use (client/agent_channel.h), not a copy of it.
  m.def("default_socket", &DefaultAgentSocket);
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

  py::class_<Completions, std::shared_ptr<Completions>>(m, "Completions")
      .def(py::init<>())
      .def("next", &Completions::Next)
      .def("close", &Completions::Close);

  py::class_<PyCall>(m, "Call")
      .def("wait", &PyCall::Wait, py::arg("timeout") = py::none())
      .def("result", &PyCall::Result)
      .def("done", &PyCall::done)
      .def("cancel", &PyCall::Cancel);

  py::class_<PyBuffer, std::shared_ptr<PyBuffer>>(m, "Buffer", py::buffer_protocol())
      .def_property_readonly("id", &PyBuffer::id)
      .def_property_readonly("name", &PyBuffer::name)
      .def_property_readonly("size", &PyBuffer::size)
      .def_property_readonly("device", &PyBuffer::device)
      .def_property_readonly("address", &PyBuffer::address)
      .def_property_readonly("backend", &PyBuffer::backend)
      .def_property("owned", &PyBuffer::owned, &PyBuffer::set_owned)
      .def_property_readonly("session", &PyBuffer::session)
      .def("free", &PyBuffer::Free)
      .def(
          "dlpack",
          [](py::object self, const std::string& dtype, const std::vector<int64_t>& shape,
             const std::vector<int64_t>& strides, uint64_t offset) {
            return MakeDLPack(std::move(self), dtype, shape, strides, offset);
          },
          py::arg("dtype"), py::arg("shape"), py::arg("strides") = std::vector<int64_t>{},
          py::arg("offset") = 0)
      .def_buffer([](PyBuffer& b) {
        if (!b.cpu_addressable()) {
          throw StatusError(absl::FailedPreconditionError(
              absl::StrCat("buffer ", b.id(), " is on ", b.device(), "; use DLPack")));
        }
        return py::buffer_info(b.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.size())}, {1});
      });

  py::class_<NotificationReader>(m, "NotificationStream")
      .def("next", [](NotificationReader& r) -> py::object {
        // Interruptible as the calls are: Ctrl-C ends the stream and raises.
        WaitInSlices(
            absl::InfiniteFuture(), [&r](absl::Time t) { return r.WaitUntil(t); },
            [&r] { r.Cancel(); });
        auto got = Take(r.Next());  // ready: does not wait
        if (!got) return py::none();
        return NotificationDict(*got);
      })
      .def("cancel", &NotificationReader::Cancel);

  py::class_<Session, std::shared_ptr<Session>> session(m, "Session");
  session
      .def(py::init(&Connect), py::arg("target"), py::arg("timeout") = 5.0)
      .def_readonly("target", &Session::target)
      // The session's id, the agent run that opened it (GetInfo's incarnation) and when that
      // run started (Unix ms); `alive`: false once the session's call ended (the agent went).
      .def_property_readonly("id", [](Session& s) { return s.client->session().id(); })
      .def_property_readonly("incarnation",
                             [](Session& s) { return s.client->session().incarnation(); })
      .def_property_readonly("started_unix_ms",
                             [](Session& s) {
                               return absl::ToUnixMillis(s.client->session().agent_started());
                             })
      .def_property_readonly("alive", [](Session& s) { return s.client->session().alive(); })
      .def_property_readonly("ended", [](Session& s) {
        return std::string(s.client->session().ended().message());
      })
      .def("alloc", [](std::shared_ptr<Session> s, uint64_t size, const std::string& name,
                       const std::vector<std::string>& allowed_peers, const std::string& device) {
             absl::StatusOr<std::unique_ptr<Buffer>> b;
             {
               py::gil_scoped_release release;
               b = s->client->Alloc(size, name, device, false, allowed_peers);
             }
             return std::make_shared<PyBuffer>(s, Take(std::move(b)), true);
           },
           py::arg("size"), py::arg("name") = "",
           py::arg("allowed_peers") = std::vector<std::string>{}, py::arg("device") = "host")
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
        d["registered_bytes"] = i.registered_bytes();
        d["block_lists"] = i.block_lists();
        d["threads"] = i.threads();
        d["transfer_socket_clients"] = i.transfer_socket_clients();
        d["incarnation"] = i.incarnation();
        d["started_unix_ms"] = i.started_unix_ms();
        return d;
      })
      // The four calls below return a Call at once (see the comment at the top).
      .def("send",
           [](std::shared_ptr<Session> s, uint64_t buffer, uint64_t offset,
              const std::string& dtype, const std::vector<int64_t>& shape,
              const std::vector<int64_t>& strides, const std::string& device,
              const std::string& peer, const std::string& tag, std::optional<double> timeout,
              std::shared_ptr<Completions> completions, uint64_t key) {
             v1::TensorMeta meta = BuildMeta(dtype, shape, strides, device, tag);
             auto state = std::make_shared<CallState>(std::move(completions), key);
             s->tensors->SendAsync(buffer, offset, meta, peer, Options(timeout, state->canceller()),
                                   EndState(state, &SendResult));
             return PyCall(s, state);
           },
           py::arg("buffer"), py::arg("offset"), py::arg("dtype"), py::arg("shape"),
           py::arg("strides"), py::arg("device"), py::arg("peer"), py::arg("tag"),
           py::arg("timeout"), py::arg("completions") = nullptr, py::arg("key") = 0)
      .def("recv",
           [](std::shared_ptr<Session> s, const std::string& peer, const std::string& tag,
              uint64_t buffer, uint64_t offset, const std::string& expect_dtype,
              std::optional<std::vector<int64_t>> expect_shape, std::optional<double> timeout,
              std::shared_ptr<Completions> completions, uint64_t key) {
             RecvOptions recv;
             recv.buffer = buffer;
             recv.offset = offset;
             if (!expect_dtype.empty()) {
               recv.expect.set_dtype(Take(tensors::ParseDType(expect_dtype)));
             }
             if (expect_shape) {
               for (int64_t d : *expect_shape) recv.expect.add_shape(d);
             }
             auto state = std::make_shared<CallState>(std::move(completions), key);
             s->tensors->RecvAsync(peer, tag, recv, Options(timeout, state->canceller()),
                                   EndState(state, &RecvResult));
             return PyCall(s, state);
           },
           py::arg("peer"), py::arg("tag"), py::arg("buffer") = 0, py::arg("offset") = 0,
           py::arg("expect_dtype") = "", py::arg("expect_shape") = py::none(),
           py::arg("timeout") = 60.0, py::arg("completions") = nullptr, py::arg("key") = 0)
      .def("write_blocks",
           [](std::shared_ptr<Session> s, uint64_t local_buffer, const std::string& peer,
              const std::string& remote,
              py::array_t<uint64_t, py::array::c_style | py::array::forcecast> blocks,
              const std::string& notification, std::optional<double> timeout,
              std::shared_ptr<Completions> completions, uint64_t key,
              const py::bytes& notification_payload) {
             if (blocks.ndim() != 2 || blocks.shape(1) != 3) {
               throw StatusError(absl::InvalidArgumentError(
                   "blocks: must be N x 3 (local_offset, remote_offset, length)"));
             }
             std::vector<BlockSpec> specs(blocks.shape(0));
             auto v = blocks.unchecked<2>();
             for (py::ssize_t i = 0; i < blocks.shape(0); ++i) {
               specs[i] = {v(i, 0), v(i, 1), v(i, 2)};
             }
             auto state = std::make_shared<CallState>(std::move(completions), key);
             s->tensors->WriteBlocksAsync(local_buffer, peer, remote, specs, notification,
                                          Options(timeout, state->canceller()),
                                          EndState(state, &WriteBlocksResult),
                                          notification_payload);
             return PyCall(s, state);
           },
           py::arg("local_buffer"), py::arg("peer"), py::arg("remote_buffer"), py::arg("blocks"),
           py::arg("notification"), py::arg("timeout"), py::arg("completions") = nullptr,
           py::arg("key") = 0, py::arg("notification_payload") = py::bytes())
      .def("wait_notification",
           [](std::shared_ptr<Session> s, const std::string& name, const std::string& from_node,
              std::optional<double> timeout, std::shared_ptr<Completions> completions,
              uint64_t key) {
             auto state = std::make_shared<CallState>(std::move(completions), key);
             CallOptions options = Options(timeout, state->canceller());
             // Zero or less: a poll (answered at once), not Options' default of 60 s.
             if (timeout && *timeout <= 0) options.timeout = absl::ZeroDuration();
             s->tensors->WaitNotificationAsync(name, from_node, options,
                                               EndState(state, &NotificationResult));
             return PyCall(s, state);
           },
           py::arg("name"), py::arg("from_node"), py::arg("timeout"),
           py::arg("completions") = nullptr, py::arg("key") = 0)
      .def("open_notifications",
           [](Session& s, const std::string& prefix, double timeout, uint32_t max_count) {
             return s.tensors->OpenNotificationReader(
                 prefix, timeout > 0 ? absl::Seconds(timeout) : absl::ZeroDuration(), max_count);
           },
           py::arg("prefix"), py::arg("timeout"), py::arg("max_count") = 0,
           py::keep_alive<0, 1>())  // the stream keeps its session
      // Every pending notification matching, at once: (list of dicts, more). Over the
      // transfer socket where the agent's answers polls there, else a gRPC call.
      .def("poll_notifications",
           [](Session& s, const std::string& prefix, uint32_t max_count) {
             v1::PollNotificationsRequest req;
             req.set_prefix(prefix);
             req.set_max_count(max_count);
             absl::StatusOr<v1::PollNotificationsResponse> r;
             {
               py::gil_scoped_release release;
               auto polled = s.client->PollOnSocket(req);
               r = polled.has_value() ? *std::move(polled)
                                      : s.tensors->PollNotifications(prefix, max_count);
             }
             auto resp = Take(std::move(r));
             py::list out;
             for (const v1::Notification& n : resp.notifications()) out.append(NotificationDict(n));
             return py::make_tuple(out, resp.more());
           },
           py::arg("prefix") = "", py::arg("max_count") = 0)
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
  BindMemory(session);
  BindTransfers(session);
}

}  // namespace ferry::python
