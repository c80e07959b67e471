#include "transport/tcp/session_secrets.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/random_bytes.h"

namespace ferry::tcp {

std::string EncodeSessionRequest(uint32_t sockets) {
  return std::string(reinterpret_cast<const char*>(&sockets), sizeof(sockets));
}

absl::StatusOr<uint32_t> DecodeSessionRequest(const std::string& request) {
  uint32_t sockets = 0;
  if (request.size() != sizeof(sockets)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tcp: Connect request of ", request.size(),
                     " bytes, not the 4 of a socket count (is the peer an older ferryd?)"));
  }
  std::memcpy(&sockets, request.data(), sizeof(sockets));
  if (sockets == 0 || sockets > kMaxSocketsPerSession) {
    return absl::InvalidArgumentError(absl::StrCat("tcp: Connect request for ", sockets,
                                                   " sockets; 1 to ", kMaxSocketsPerSession,
                                                   " are admitted"));
  }
  return sockets;
}

std::string EncodeSessionReply(const SessionTicket& ticket) {
  std::string reply(kSessionReplyBytes, '\0');
  std::memcpy(reply.data(), &ticket.session, sizeof(ticket.session));
  std::memcpy(reply.data() + sizeof(ticket.session), ticket.secret.data(), ticket.secret.size());
  return reply;
}

absl::StatusOr<SessionTicket> DecodeSessionReply(const std::string& reply,
                                                 const std::string& peer) {
  if (reply.size() != kSessionReplyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("tcp: Connect reply from ", peer, " is ", reply.size(), " bytes, not the ",
                     kSessionReplyBytes, " of a session id and secret (is it an older ferryd?)"));
  }
  SessionTicket ticket;
  std::memcpy(&ticket.session, reply.data(), sizeof(ticket.session));
  std::memcpy(ticket.secret.data(), reply.data() + sizeof(ticket.session), ticket.secret.size());
  return ticket;
}

RequestHeader MakeHello(const SessionTicket& ticket) {
  RequestHeader hello = {kRequestMagic, WireOp::kHello, ticket.session, 0, 0, 0, kWireVersion};
  static_assert(sizeof(hello.address) + sizeof(hello.length) == sizeof(SessionSecret));
  std::memcpy(&hello.address, ticket.secret.data(), 8);
  std::memcpy(&hello.length, ticket.secret.data() + 8, 8);
  return hello;
}

SessionTicket TicketOfHello(const RequestHeader& hello) {
  SessionTicket ticket;
  ticket.session = hello.id;
  std::memcpy(ticket.secret.data(), &hello.address, 8);
  std::memcpy(ticket.secret.data() + 8, &hello.length, 8);
  return ticket;
}

bool SecretsEqual(const SessionSecret& a, const SessionSecret& b) {
  // Every byte is looked at whatever the first difference: how long the check takes tells
  // nothing about how much of a guess was right.
  uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

absl::StatusOr<SessionTicket> SessionSecrets::Issue(const fabric::PeerInstance& from,
                                                    uint32_t sockets, absl::Time now) {
  SessionTicket ticket;
  absl::Status random = RandomBytes(ticket.secret.data(), ticket.secret.size());
  if (!random.ok()) {
    return absl::Status(random.code(),
                        absl::StrCat("tcp: no secret for ", from.node, ": ", random.message()));
  }
  absl::MutexLock lock(&mu_);
  DropExpiredLocked(now);
  uint32_t of_peer = 0;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    const fabric::PeerInstance& peer = it->second.peer;
    // A restarted peer's older incarnation is gone: what it was issued must not admit
    // anybody (incarnation 0: unknown, revokes nothing).
    if (peer.node == from.node && from.incarnation != 0 && peer.incarnation != from.incarnation) {
      it = sessions_.erase(it);
      continue;
    }
    if (peer.node == from.node) ++of_peer;
    ++it;
  }
  // Oldest first: a peer that connects again and again cannot hold more than its share.
  for (auto it = sessions_.begin(); of_peer >= kSessionsPerPeer && it != sessions_.end();) {
    if (it->second.peer.node == from.node) {
      it = sessions_.erase(it);
      --of_peer;
    } else {
      ++it;
    }
  }
  if (sessions_.size() >= kMaxSessions) sessions_.erase(sessions_.begin());
  ticket.session = ++next_session_;
  sessions_.emplace(ticket.session, Entry{from, ticket.secret, sockets, now + kSessionLifetime});
  return ticket;
}

std::optional<SessionSecrets::Admitted> SessionSecrets::Admit(uint64_t session,
                                                              const SessionSecret& secret,
                                                              Refused* why, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) {
    *why = Refused::kUnknown;
    return std::nullopt;
  }
  if (!SecretsEqual(it->second.secret, secret)) {
    *why = Refused::kWrongSecret;
    return std::nullopt;
  }
  if (it->second.expires < now) {
    *why = Refused::kExpired;
    sessions_.erase(it);
    return std::nullopt;
  }
  Admitted admitted{it->second.peer};
  if (--it->second.sockets_left == 0) sessions_.erase(it);
  return admitted;
}

size_t SessionSecrets::size() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

void SessionSecrets::DropExpiredLocked(absl::Time now) {
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    it = it->second.expires < now ? sessions_.erase(it) : std::next(it);
  }
}

}  // namespace ferry::tcp
