#include "transport/verbs/verbs_endpoint.h"

namespace ferry::verbs {

void VerbsEndpoint::Close() {
  qp_->Close();
  // The target never learns by itself that this QP is gone; the next handshake tells it.
  std::call_once(retire_once_, [this] {
    if (uint32_t remote = qp_->remote_qpn(); remote != 0) retired_->Add(peer_address_, remote);
  });
}

}  // namespace ferry::verbs
