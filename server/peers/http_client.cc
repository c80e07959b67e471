#include "server/peers/http_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <map>
#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "base/unique_fd.h"
#include "transport/tcp/socket.h"

namespace ferry::server {
namespace {

using Stopped = std::function<bool()>;
using Sink = std::function<absl::Status(absl::string_view)>;

// How often a wait looks at `stopped`.
constexpr absl::Duration kPollSlice = absl::Milliseconds(100);
constexpr size_t kMaxHeaderBytes = 64 << 10;
constexpr size_t kMaxBodyBytes = 64 << 20;

// Waits until `fd` is ready for `events`: DEADLINE_EXCEEDED after `deadline`, CANCELLED once
// `stopped` (may be null) says so.
absl::Status WaitFor(int fd, short events, absl::Time deadline, const Stopped* stopped,
                     const std::string& what) {
  while (true) {
    if (stopped != nullptr && (*stopped)()) return absl::CancelledError(what + ": stopped");
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": no answer in time"));
    }
    pollfd p = {fd, events, 0};
    const int ms = static_cast<int>(
        std::clamp<int64_t>(absl::ToInt64Milliseconds(std::min(left, kPollSlice)), 1, 100));
    const int n = poll(&p, 1, ms);
    if (n < 0 && errno != EINTR) return absl::ErrnoToStatus(errno, "poll()");
    if (n > 0) return absl::OkStatus();
  }
}

absl::StatusOr<UniqueFd> Connect(const std::string& host_port, absl::Time deadline) {
  ASSIGN_OR_RETURN(tcp::HostPort hp, tcp::ParseHostPort(host_port));
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = absl::StrCat(hp.port);
  if (int rc = getaddrinfo(hp.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("resolve ", host_port, ": ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> list(found, freeaddrinfo);
  const std::string what = absl::StrCat("connect(", host_port, ")");
  absl::Status last = absl::UnavailableError(absl::StrCat(what, ": no address"));
  for (addrinfo* a = list.get(); a != nullptr; a = a->ai_next) {
    UniqueFd fd(socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) return absl::ErrnoToStatus(errno, "socket()");
    if (connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = tcp::SocketError(errno, what);
        continue;
      }
      if (absl::Status ready = WaitFor(fd.get(), POLLOUT, deadline, nullptr, what); !ready.ok()) {
        last = absl::UnavailableError(ready.message());
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last = tcp::SocketError(err, what);
        continue;
      }
    }
    int one = 1;
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // A watch idles for hours: keepalives notice a server that vanished without a FIN
    // (host down, network partition) within about 25 s.
    int idle = 10, interval = 5, count = 3;
    setsockopt(fd.get(), SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd.get(), IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd.get(), IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
    setsockopt(fd.get(), IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
    return fd;
  }
  return last;
}

// One request's connection: writes the request, then reads the response from a buffer.
class Connection {
 public:
  Connection(UniqueFd fd, std::string what) : fd_(std::move(fd)), what_(std::move(what)) {}

  absl::Status Send(absl::string_view data, absl::Time deadline) {
    while (!data.empty()) {
      RETURN_IF_ERROR(WaitFor(fd_.get(), POLLOUT, deadline, nullptr, what_));
      ssize_t n = send(fd_.get(), data.data(), data.size(), MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) continue;
        return tcp::SocketError(errno, absl::StrCat("send to ", what_));
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  // Reads what has arrived into the buffer. UNAVAILABLE at the end of the stream.
  absl::Status Fill(absl::Time deadline, const Stopped* stopped) {
    while (true) {
      RETURN_IF_ERROR(WaitFor(fd_.get(), POLLIN, deadline, stopped, what_));
      char chunk[16 << 10];
      ssize_t n = recv(fd_.get(), chunk, sizeof(chunk), 0);
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) continue;
        return tcp::SocketError(errno, absl::StrCat("recv from ", what_));
      }
      if (n == 0) {
        eof_ = true;
        return absl::UnavailableError(absl::StrCat(what_, ": the server closed the connection"));
      }
      buffer_.append(chunk, static_cast<size_t>(n));
      return absl::OkStatus();
    }
  }

  // A line without its CRLF.
  absl::StatusOr<std::string> ReadLine(absl::Time deadline, const Stopped* stopped) {
    size_t end;
    while ((end = buffer_.find("\r\n")) == std::string::npos) {
      if (buffer_.size() > kMaxHeaderBytes) {
        return absl::ResourceExhaustedError(absl::StrCat(what_, ": a header line over 64 KiB"));
      }
      RETURN_IF_ERROR(Fill(deadline, stopped));
    }
    std::string line = buffer_.substr(0, end);
    buffer_.erase(0, end + 2);
    return line;
  }

  absl::StatusOr<std::string> ReadExactly(size_t n, absl::Time deadline, const Stopped* stopped) {
    while (buffer_.size() < n) RETURN_IF_ERROR(Fill(deadline, stopped));
    std::string out = buffer_.substr(0, n);
    buffer_.erase(0, n);
    return out;
  }

  // What is buffered, then emptied.
  std::string Take() { return std::exchange(buffer_, {}); }
  bool eof() const { return eof_; }
  const std::string& what() const { return what_; }

 private:
  UniqueFd fd_;
  const std::string what_;
  std::string buffer_;
  bool eof_ = false;
};

struct Head {
  int status = 0;
  std::map<std::string, std::string> headers;  // names in lower case
};

absl::StatusOr<Head> ReadHead(Connection& c, absl::Time deadline) {
  Head head;
  ASSIGN_OR_RETURN(std::string status_line, c.ReadLine(deadline, nullptr));
  // "HTTP/1.1 200 OK"
  std::vector<std::string> parts = absl::StrSplit(status_line, absl::MaxSplits(' ', 2));
  if (parts.size() < 2 || !absl::StartsWith(parts[0], "HTTP/1.") ||
      !absl::SimpleAtoi(parts[1], &head.status)) {
    return absl::UnavailableError(
        absl::StrCat(c.what(), ": not an HTTP response: '", status_line.substr(0, 64), "'"));
  }
  while (true) {
    ASSIGN_OR_RETURN(std::string line, c.ReadLine(deadline, nullptr));
    if (line.empty()) return head;
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    head.headers[absl::AsciiStrToLower(line.substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
}

// Hands the body to `sink` piece by piece as it arrives.
absl::Status ReadBody(Connection& c, const Head& head, absl::Time deadline,
                      const Stopped* stopped, const Sink& sink) {
  auto encoding = head.headers.find("transfer-encoding");
  if (encoding != head.headers.end() && absl::AsciiStrToLower(encoding->second) == "chunked") {
    while (true) {
      ASSIGN_OR_RETURN(std::string size_line, c.ReadLine(deadline, stopped));
      size_t size = 0;
      const std::string digits = size_line.substr(0, size_line.find(';'));
      auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), size, 16);
      if (ec != std::errc() || digits.empty() || size > kMaxBodyBytes) {
        return absl::UnavailableError(
            absl::StrCat(c.what(), ": bad chunk size '", size_line.substr(0, 32), "'"));
      }
      if (size == 0) {
        // Trailers, up to the empty line.
        while (true) {
          ASSIGN_OR_RETURN(std::string trailer, c.ReadLine(deadline, stopped));
          if (trailer.empty()) return absl::OkStatus();
        }
      }
      ASSIGN_OR_RETURN(std::string data, c.ReadExactly(size + 2, deadline, stopped));
      data.resize(size);  // without the chunk's CRLF
      RETURN_IF_ERROR(sink(data));
    }
  }
  auto length = head.headers.find("content-length");
  if (length != head.headers.end()) {
    size_t n = 0;
    if (!absl::SimpleAtoi(length->second, &n) || n > kMaxBodyBytes) {
      return absl::UnavailableError(absl::StrCat(c.what(), ": bad Content-Length"));
    }
    ASSIGN_OR_RETURN(std::string data, c.ReadExactly(n, deadline, stopped));
    return sink(data);
  }
  // Neither: the body runs to the close.
  while (true) {
    if (std::string data = c.Take(); !data.empty()) RETURN_IF_ERROR(sink(data));
    absl::Status more = c.Fill(deadline, stopped);
    if (c.eof()) return absl::OkStatus();
    RETURN_IF_ERROR(more);
  }
}

absl::StatusOr<Connection> Open(const std::string& host_port, const std::string& path,
                                absl::string_view body, absl::Time deadline) {
  ASSIGN_OR_RETURN(UniqueFd fd, Connect(host_port, deadline));
  Connection c(std::move(fd), absl::StrCat("http://", host_port, path));
  const std::string request =
      absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: ", host_port,
                   "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
                   "\r\nConnection: close\r\n\r\n", body);
  RETURN_IF_ERROR(c.Send(request, deadline));
  return c;
}

}  // namespace

absl::StatusOr<HttpResponse> HttpPost(const std::string& host_port, const std::string& path,
                                      absl::string_view body, absl::Time deadline) {
  ASSIGN_OR_RETURN(Connection c, Open(host_port, path, body, deadline));
  ASSIGN_OR_RETURN(Head head, ReadHead(c, deadline));
  HttpResponse out;
  out.status = head.status;
  RETURN_IF_ERROR(ReadBody(c, head, deadline, nullptr, [&out](absl::string_view data) {
    if (out.body.size() + data.size() > kMaxBodyBytes) {
      return absl::ResourceExhaustedError("an HTTP response over 64 MiB");
    }
    out.body.append(data.data(), data.size());
    return absl::OkStatus();
  }));
  return out;
}

absl::Status HttpPostStream(const std::string& host_port, const std::string& path,
                            absl::string_view body, absl::Time connect_deadline,
                            const std::function<absl::Status(absl::string_view)>& on_line,
                            const std::function<bool()>& stopped) {
  ASSIGN_OR_RETURN(Connection c, Open(host_port, path, body, connect_deadline));
  ASSIGN_OR_RETURN(Head head, ReadHead(c, connect_deadline));
  if (head.status != 200) {
    std::string text;
    ReadBody(c, head, connect_deadline, &stopped, [&text](absl::string_view data) {
      absl::string_view head = data.substr(0, 512 - std::min<size_t>(512, text.size()));
      text.append(head.data(), head.size());
      return absl::OkStatus();
    }).IgnoreError();
    return absl::UnavailableError(
        absl::StrCat(c.what(), ": HTTP ", head.status, " ", absl::StripAsciiWhitespace(text)));
  }
  std::string pending;
  absl::Status ended = ReadBody(
      c, head, absl::InfiniteFuture(), &stopped, [&](absl::string_view data) -> absl::Status {
        pending.append(data.data(), data.size());
        size_t end;
        while ((end = pending.find('\n')) != std::string::npos) {
          std::string line = pending.substr(0, end);
          pending.erase(0, end + 1);
          if (!absl::StripAsciiWhitespace(line).empty()) RETURN_IF_ERROR(on_line(line));
        }
        if (pending.size() > kMaxBodyBytes) {
          return absl::ResourceExhaustedError(absl::StrCat(c.what(), ": a line over 64 MiB"));
        }
        return absl::OkStatus();
      });
  RETURN_IF_ERROR(ended);
  if (!absl::StripAsciiWhitespace(pending).empty()) return on_line(pending);
  return absl::OkStatus();
}

}  // namespace ferry::server
