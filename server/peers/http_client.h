#pragma once
// The least HTTP/1.1 client etcd's JSON gateway needs: one POST per connection ("Connection:
// close"), plain TCP, a response body by Content-Length, chunked, or up to the close. Enough
// for a local service of our own choosing; not a general client (no TLS, no redirects, no
// keep-alive, no proxies).

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ferry::server {

struct HttpResponse {
  int status = 0;  // 200, 404, ...
  std::string body;
};

// POSTs `body` (JSON) to http://`host_port``path`. UNAVAILABLE when nobody answers or the
// connection breaks, DEADLINE_EXCEEDED after `deadline`; an HTTP error status is a response.
absl::StatusOr<HttpResponse> HttpPost(const std::string& host_port, const std::string& path,
                                      absl::string_view body, absl::Time deadline);

// POSTs `body` and reads a response that streams (etcd's watch): `on_line` is called, on this
// thread, with each newline-terminated piece of the body as it arrives. Runs until the body
// ends (OK), `stopped()` is true (CANCELLED; checked at least every 100 ms), `on_line`
// returns an error (that one), or the connection fails. `connect_deadline` bounds only the
// connection and the response's header; the body may take forever.
absl::Status HttpPostStream(const std::string& host_port, const std::string& path,
                            absl::string_view body, absl::Time connect_deadline,
                            const std::function<absl::Status(absl::string_view)>& on_line,
                            const std::function<bool()>& stopped);

}  // namespace ferry::server
