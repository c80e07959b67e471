#include "server/peers/etcd_client.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/json_writer.h"
#include "base/status_macros.h"
#include "server/peers/http_client.h"
#include "server/peers/json_fields.h"

namespace ferry::server {
namespace {

using json::Field;
using json::Flag;
using json::Int;
using json::Object;
using json::Struct;
using json::Text;
using json::Value;

absl::StatusOr<Struct> ParseJson(const std::string& text, const std::string& what) {
  return json::ParseObject(text, absl::StrCat("etcd ", what));
}

std::string Base64(const std::string& bytes) { return absl::Base64Escape(bytes); }

std::string Unbase64(const std::string& text) {
  std::string out;
  return absl::Base64Unescape(text, &out) ? out : "";
}

// {"error": "...", "code": 5, "message": "..."}: etcd's refusal, as its gRPC code.
absl::Status ErrorOf(const Struct& answer, const std::string& what) {
  const Value* error = Field(answer, "error");
  if (error == nullptr) return absl::OkStatus();
  std::string message = Text(answer, "message");
  if (message.empty() && error->kind_case() == Value::kStringValue) message = error->string_value();
  if (error->has_struct_value()) {  // the watch stream's shape: {"error": {"grpc_code": ...}}
    message = Text(error->struct_value(), "message");
    return absl::Status(static_cast<absl::StatusCode>(Int(error->struct_value(), "grpc_code")),
                        absl::StrCat(what, ": ", message));
  }
  int64_t code = Int(answer, "code");
  if (code <= 0 || code > 16) code = static_cast<int64_t>(absl::StatusCode::kUnknown);
  return absl::Status(static_cast<absl::StatusCode>(code), absl::StrCat(what, ": ", message));
}

EtcdKeyValue KeyValueOf(const Struct& kv) {
  EtcdKeyValue out;
  out.key = Unbase64(Text(kv, "key"));
  out.value = Unbase64(Text(kv, "value"));
  out.mod_revision = Int(kv, "mod_revision");
  out.lease = Int(kv, "lease");
  return out;
}

}  // namespace

EtcdClient::EtcdClient(std::vector<std::string> endpoints, absl::Duration timeout)
    : endpoints_(std::move(endpoints)), timeout_(timeout) {}

std::string EtcdClient::PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

absl::StatusOr<std::string> EtcdClient::Call(const std::string& path, const std::string& body) {
  if (endpoints_.empty()) return absl::FailedPreconditionError("no etcd endpoints configured");
  absl::Status last;
  const size_t first = current_.load();
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    const size_t at = (first + i) % endpoints_.size();
    const std::string& endpoint = endpoints_[at];
    auto response = HttpPost(endpoint, path, body, absl::Now() + timeout_);
    if (!response.ok()) {
      last = absl::UnavailableError(
          absl::StrCat("etcd at ", endpoint, ": ", response.status().message()));
      continue;
    }
    // An etcd member without a quorum says UNAVAILABLE: another may have one.
    if (response->status == 503) {
      last = absl::UnavailableError(absl::StrCat("etcd at ", endpoint, " ", path, ": ",
                                                 response->body.substr(0, 256)));
      continue;
    }
    current_.store(at);
    return std::move(response->body);
  }
  return last;
}

absl::StatusOr<int64_t> EtcdClient::Grant(absl::Duration ttl) {
  JsonWriter w;
  w.BeginObject().Key("TTL").String(absl::StrCat(absl::ToInt64Seconds(ttl))).EndObject();
  ASSIGN_OR_RETURN(std::string text, Call("/v3/lease/grant", w.str()));
  ASSIGN_OR_RETURN(Struct answer, ParseJson(text, "lease grant"));
  RETURN_IF_ERROR(ErrorOf(answer, "etcd lease grant"));
  const int64_t id = Int(answer, "ID");
  if (id == 0) return absl::UnavailableError(absl::StrCat("etcd granted no lease: ", text));
  return id;
}

absl::StatusOr<int64_t> EtcdClient::KeepAlive(int64_t lease) {
  // The gateway maps the keepalive stream to one request and one answer per POST.
  JsonWriter w;
  w.BeginObject().Key("ID").String(absl::StrCat(lease)).EndObject();
  ASSIGN_OR_RETURN(std::string text, Call("/v3/lease/keepalive", w.str()));
  ASSIGN_OR_RETURN(Struct answer, ParseJson(text, "lease keepalive"));
  RETURN_IF_ERROR(ErrorOf(answer, "etcd lease keepalive"));
  const Struct* result = Object(answer, "result");
  if (result == nullptr) return absl::UnavailableError(absl::StrCat("etcd keepalive: ", text));
  return Int(*result, "TTL");  // absent (0): the lease is gone
}

absl::Status EtcdClient::Revoke(int64_t lease) {
  JsonWriter w;
  w.BeginObject().Key("ID").String(absl::StrCat(lease)).EndObject();
  ASSIGN_OR_RETURN(std::string text, Call("/v3/lease/revoke", w.str()));
  ASSIGN_OR_RETURN(Struct answer, ParseJson(text, "lease revoke"));
  absl::Status refused = ErrorOf(answer, "etcd lease revoke");
  return absl::IsNotFound(refused) ? absl::OkStatus() : refused;  // gone already
}

absl::Status EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  JsonWriter w;
  w.BeginObject().Key("key").String(Base64(key)).Key("value").String(Base64(value));
  if (lease != 0) w.Key("lease").String(absl::StrCat(lease));
  w.EndObject();
  ASSIGN_OR_RETURN(std::string text, Call("/v3/kv/put", w.str()));
  ASSIGN_OR_RETURN(Struct answer, ParseJson(text, "put"));
  return ErrorOf(answer, absl::StrCat("etcd put ", key));
}

absl::Status EtcdClient::Delete(const std::string& key) {
  JsonWriter w;
  w.BeginObject().Key("key").String(Base64(key)).EndObject();
  ASSIGN_OR_RETURN(std::string text, Call("/v3/kv/deleterange", w.str()));
  ASSIGN_OR_RETURN(Struct answer, ParseJson(text, "deleterange"));
  return ErrorOf(answer, absl::StrCat("etcd delete ", key));
}

absl::StatusOr<EtcdRange> EtcdClient::RangePrefix(const std::string& prefix) {
  JsonWriter w;
  w.BeginObject()
      .Key("key")
      .String(Base64(prefix))
      .Key("range_end")
      .String(Base64(PrefixEnd(prefix)))
      .EndObject();
  ASSIGN_OR_RETURN(std::string text, Call("/v3/kv/range", w.str()));
  ASSIGN_OR_RETURN(Struct answer, ParseJson(text, "range"));
  RETURN_IF_ERROR(ErrorOf(answer, absl::StrCat("etcd range ", prefix)));
  EtcdRange out;
  if (const Struct* header = Object(answer, "header")) out.revision = Int(*header, "revision");
  if (const Value* kvs = Field(answer, "kvs"); kvs != nullptr && kvs->has_list_value()) {
    for (const Value& kv : kvs->list_value().values()) {
      if (kv.has_struct_value()) out.kvs.push_back(KeyValueOf(kv.struct_value()));
    }
  }
  return out;
}

absl::Status EtcdClient::WatchPrefix(const std::string& prefix, int64_t start_revision,
                                     const std::function<void(const EtcdEvent&)>& on_event,
                                     const std::function<bool()>& stopped) {
  if (endpoints_.empty()) return absl::FailedPreconditionError("no etcd endpoints configured");
  JsonWriter w;
  w.BeginObject().Key("create_request").BeginObject();
  w.Key("key").String(Base64(prefix)).Key("range_end").String(Base64(PrefixEnd(prefix)));
  w.Key("start_revision").String(absl::StrCat(start_revision));
  w.EndObject().EndObject();
  const size_t at = current_.load() % endpoints_.size();
  const std::string& endpoint = endpoints_[at];
  absl::Status ended = HttpPostStream(
      endpoint, "/v3/watch", w.str(), absl::Now() + timeout_,
      [&](absl::string_view line) -> absl::Status {
        ASSIGN_OR_RETURN(Struct message, ParseJson(std::string(line), "watch"));
        RETURN_IF_ERROR(ErrorOf(message, "etcd watch"));
        const Struct* result = Object(message, "result");
        if (result == nullptr) return absl::OkStatus();
        if (Flag(*result, "canceled")) {
          return absl::AbortedError(absl::StrCat(
              "etcd cancelled the watch of ", prefix, ": ", Text(*result, "cancel_reason"),
              Int(*result, "compact_revision") ? absl::StrCat(" (compacted to revision ",
                                                              Int(*result, "compact_revision"),
                                                              ")")
                                               : ""));
        }
        const Value* events = Field(*result, "events");
        if (events == nullptr || !events->has_list_value()) return absl::OkStatus();
        for (const Value& e : events->list_value().values()) {
          if (!e.has_struct_value()) continue;
          EtcdEvent event;
          event.type = Text(e.struct_value(), "type") == "DELETE" ? EtcdEvent::Type::kDelete
                                                                   : EtcdEvent::Type::kPut;
          if (const Struct* kv = Object(e.struct_value(), "kv")) event.kv = KeyValueOf(*kv);
          on_event(event);
        }
        return absl::OkStatus();
      },
      stopped);
  if (absl::IsCancelled(ended)) return absl::OkStatus();  // stopped
  if (ended.ok()) {
    ended = absl::UnavailableError(absl::StrCat("etcd at ", endpoint, " ended the watch"));
  }
  if (absl::IsUnavailable(ended) || absl::IsDeadlineExceeded(ended)) {
    current_.store((at + 1) % endpoints_.size());  // the next try goes to the next one
  }
  return ended;
}

}  // namespace ferry::server
