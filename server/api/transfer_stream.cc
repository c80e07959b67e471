#include "server/api/transfer_stream.h"

#include <deque>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/api/request_arena.h"

namespace ferry::server {
namespace {

using Request = ferry::v1::StreamedTransfer;
using Answer = ferry::v1::StreamedResult;
using Answers = ferry::v1::StreamedResults;

// Answers ready together go in one message up to this size (a default client takes 4 MiB).
constexpr size_t kAnswerBytes = 2 << 20;

// One read and one write outstanding at most, as gRPC's callback API requires, so answers
// that end while a write is out wait and then go together in the next. Reads, writes and
// Finish are started under `mu_`: gRPC runs the reactions (OnReadDone, OnWriteDone) on its
// own threads, never inside StartRead/StartWrite, so holding the lock there cannot deadlock.
// The reactor owns itself (`self_`) until OnDone, and every running transfer's answer holds
// it too: a transfer that ends after the call finds it finished and answers nobody.
class TransferStreamReactor : public grpc::ServerBidiReactor<Request, Answers>,
                              public std::enable_shared_from_this<TransferStreamReactor> {
 public:
  TransferStreamReactor(WorkerPool* starters, std::shared_ptr<const TransferCalls> calls)
      : starters_(starters), calls_(std::move(calls)), request_(NewRequest()) {}

  // Not in the constructor: answers take shared_from_this(), which needs the owner first.
  void Begin(std::shared_ptr<TransferStreamReactor> self) {
    absl::MutexLock lock(&mu_);
    self_ = std::move(self);
    reading_ = true;
    StartRead(request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client closed its side, or went away (then OnCancel follows)
      absl::MutexLock lock(&mu_);
      reading_ = false;
      reads_done_ = true;
      FinishIfAnsweredLocked();
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      if (finished_) {  // cancelled meanwhile: start nothing for nobody
        reading_ = false;
        return;
      }
      // Counted before it starts: its answer may come before the start returns.
      ++open_;
    }
    // The next read starts once this one started (reading_ stays true until then), so a
    // stream's requests start in the order sent and request_ is not overwritten meanwhile.
    std::optional<std::string> peer = calls_->MayBlockOn(request_->transfer());
    if (!peer) {
      StartRequest();
      return;
    }
    // A peer must resolve a buffer (a blocking call): on a starter, not on this gRPC thread.
    starters_->Run(*peer, [self = shared_from_this()] { self->StartRequest(); });
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the client went away"));
      return;
    }
    open_ -= written_;  // answered: room for as many more requests
    written_ = 0;
    WriteNextLocked();
    ReadIfRoomLocked();
    FinishIfAnsweredLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    FinishLocked(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    std::shared_ptr<TransferStreamReactor> last;
    {
      absl::MutexLock lock(&mu_);
      finished_ = true;
      queue_.clear();
      last = std::move(self_);
    }
    // `last` may be the final owner: this goes with it, after the lock.
  }

 private:
  void StartRequest() {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) {  // the call ended while this waited for a starter
        reading_ = false;
        return;
      }
    }
    const uint64_t tag = request_->tag();
    std::shared_ptr<TransferStreamReactor> self = shared_from_this();
    absl::StatusOr<uint64_t> started =
        calls_->Start(request_->transfer(), [self, tag](ferry::v1::TransferResult result) {
          Answer answer;
          answer.set_tag(tag);
          *answer.mutable_result() = std::move(result);
          self->Send(std::move(answer));
        });
    if (!started.ok()) {
      Answer answer;
      answer.set_tag(tag);
      answer.set_code(static_cast<int>(started.status().code()));
      answer.set_message(std::string(started.status().message()));
      Send(std::move(answer));
    }
    // The engine took what it needs from the request (Submit copies, holds no reference).
    request_ = NewRequest();
    absl::MutexLock lock(&mu_);
    reading_ = false;
    ReadIfRoomLocked();
  }

  // The last request's memory goes back at once; the next read parses into a fresh one.
  Request* NewRequest() {
    arena_.Reset();
    return google::protobuf::Arena::CreateMessage<Request>(arena_.arena());
  }

  // Queues an answer, and writes it if no write is outstanding.
  void Send(Answer answer) {
    absl::MutexLock lock(&mu_);
    if (finished_) return;  // nobody to tell: the call ended
    queue_.push_back(std::move(answer));
    if (!writing_) WriteNextLocked();
  }

  // Every queued answer that fits kAnswerBytes (at least one) in one message.
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (queue_.empty() || finished_) return;
    writing_answers_.Clear();
    size_t bytes = 0;
    while (!queue_.empty()) {
      const size_t size = queue_.front().ByteSizeLong();
      if (writing_answers_.results_size() > 0 && bytes + size > kAnswerBytes) break;
      bytes += size;
      *writing_answers_.add_results() = std::move(queue_.front());
      queue_.pop_front();
    }
    written_ = static_cast<size_t>(writing_answers_.results_size());
    writing_ = true;
    StartWrite(&writing_answers_);
  }

  void ReadIfRoomLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reading_ || reads_done_ || finished_ || open_ >= kStreamWindow) return;
    reading_ = true;
    StartRead(request_);
  }

  void FinishIfAnsweredLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reads_done_ && open_ == 0 && !writing_) FinishLocked(grpc::Status::OK);
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    queue_.clear();
    Finish(status);
  }

  WorkerPool* const starters_;
  const std::shared_ptr<const TransferCalls> calls_;
  // The read in progress, in arena_ (a batch of ops is a few bumps of a pointer, not a
  // malloc per op); read again only once it started. Both are touched only by the chain
  // read, start, read again, one step at a time.
  RequestArena arena_;
  Request* request_;

  absl::Mutex mu_;
  std::shared_ptr<TransferStreamReactor> self_ ABSL_GUARDED_BY(mu_);
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // Requests read and not yet answered (running, or their answer queued or being written).
  size_t open_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Answer> queue_ ABSL_GUARDED_BY(mu_);
  Answers writing_answers_ ABSL_GUARDED_BY(mu_);
  size_t written_ ABSL_GUARDED_BY(mu_) = 0;  // answers in writing_answers_
};

}  // namespace

grpc::ServerBidiReactor<ferry::v1::StreamedTransfer, ferry::v1::StreamedResults>*
StartTransferStream(WorkerPool* starters, std::shared_ptr<const TransferCalls> calls) {
  auto reactor = std::make_shared<TransferStreamReactor>(starters, std::move(calls));
  TransferStreamReactor* raw = reactor.get();
  raw->Begin(std::move(reactor));
  return raw;
}

}  // namespace ferry::server
