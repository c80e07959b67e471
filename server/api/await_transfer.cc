#include "server/api/await_transfer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ferry::server {

grpc::Status AwaitTransferResult(grpc::ServerContext* ctx, const Transfer& transfer,
                                 const ResultPage& page, ferry::v1::TransferResult* resp,
                                 std::optional<absl::Time> until) {
  const absl::Time deadline = std::min(absl::FromChrono(ctx->deadline()),
                                       until.value_or(absl::InfiniteFuture()));
  // Wake up now and then to notice a client that hung up.
  while (!transfer.AwaitFinished(std::min(deadline, absl::Now() + absl::Milliseconds(500)))) {
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    if (absl::Now() >= deadline) {
      if (until) break;  // the caller's own limit: the result as it stands (RUNNING)
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          absl::StrCat("transfer ", transfer.id(), " is still running"));
    }
  }
  *resp = transfer.Result(page);
  return grpc::Status::OK;
}

}  // namespace ferry::server
