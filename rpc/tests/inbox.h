// Inbox: what one side of a connection receives (messages, closes, flushes), with waits
// on those events, for the transport tests.
#ifndef GRADWIRE_RPC_TESTS_INBOX_H_
#define GRADWIRE_RPC_TESTS_INBOX_H_

#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gradwire/rpc/transport.h"

namespace gw::rpc::testing {

// Collects what one side of a connection receives.
class Inbox {
 public:
  ConnectionCallbacks Callbacks() {
    return {[this](const std::shared_ptr<Connection>& c, Message m) {
              absl::MutexLock lock(&mu_);
              last_conn_ = c;
              messages_.push_back(std::move(m));
            },
            [this](const std::shared_ptr<Connection>&, const absl::Status& s) {
              absl::MutexLock lock(&mu_);
              unflushed_at_close_ = messages_.size() - flushed_;
              closes_.push_back(s);
            },
            [this](const std::shared_ptr<Connection>&) {
              absl::MutexLock lock(&mu_);
              if (messages_.size() == flushed_) ++empty_flushes_;  // nothing since the last one
              flushed_ = messages_.size();
            }};
  }
  // Waits until on_flush has run after the n-th message.
  bool WaitFlushed(size_t n, absl::Duration timeout = absl::Seconds(20)) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return flushed_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }
  int empty_flushes() {
    absl::MutexLock lock(&mu_);
    return empty_flushes_;
  }
  size_t unflushed_at_close() {
    absl::MutexLock lock(&mu_);
    return unflushed_at_close_;
  }
  bool WaitMessages(size_t n, absl::Duration timeout = absl::Seconds(20)) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return messages_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  absl::Status WaitClose(absl::Duration timeout = absl::Seconds(20)) {
    absl::MutexLock lock(&mu_);
    auto closed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !closes_.empty(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&closed), timeout)) return absl::DeadlineExceededError("no close");
    return closes_[0];
  }
  std::vector<Message> messages() {
    absl::MutexLock lock(&mu_);
    return messages_;
  }
  std::shared_ptr<Connection> last_conn() {
    absl::MutexLock lock(&mu_);
    return last_conn_;
  }
  // Forgets the messages and flushes seen so far (not the connection or the closes).
  void Clear() {
    absl::MutexLock lock(&mu_);
    messages_.clear();
    flushed_ = 0;
    empty_flushes_ = 0;
  }

 private:
  absl::Mutex mu_;
  std::vector<Message> messages_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> closes_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Connection> last_conn_ ABSL_GUARDED_BY(mu_);
  size_t flushed_ ABSL_GUARDED_BY(mu_) = 0;  // messages delivered before the last on_flush
  int empty_flushes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t unflushed_at_close_ ABSL_GUARDED_BY(mu_) = 0;
};

// Sends "ping" over `conn` (dialled with `client`'s callbacks) and waits until the side
// that `server` collects has answered "pong": by then each side has processed what the
// other sent before, a transport's own handshake included. Both inboxes are cleared.
inline bool RoundTrip(Connection& conn, Inbox& server, Inbox& client, absl::Duration timeout = absl::Seconds(20)) {
  conn.Send(Message{"ping", {}});
  if (!server.WaitMessages(1, timeout)) return false;
  server.last_conn()->Send(Message{"pong", {}});
  if (!client.WaitMessages(1, timeout)) return false;
  server.Clear();
  client.Clear();
  return true;
}

}  // namespace gw::rpc::testing

#endif  // GRADWIRE_RPC_TESTS_INBOX_H_
