#include "cluster/heartbeats.h"

#include <cstdio>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gradwire/rpc/errors.h"
#include "wire/codec.h"

namespace gw::rpc::internal {
namespace {

void SendBeat(Connection& conn, Kind kind) {
  Envelope beat;
  beat.kind = kind;
  if (absl::StatusOr<Message> m = EncodeEnvelope(beat); m.ok()) conn.Send(*std::move(m));
}

}  // namespace

Heartbeats::Heartbeats(std::string self_name, int capacity, absl::Duration interval, absl::Duration timeout,
                       Peers& peers, TimerQueue& timers, std::function<bool()> closed)
    : self_name_(std::move(self_name)),
      enabled_(interval > absl::ZeroDuration()),
      liveness_(capacity, enabled_ ? interval : absl::Seconds(1), timeout),
      peers_(peers),
      timers_(timers),
      closed_(std::move(closed)),
      sender_(1, "gw-heartbeat") {}

void Heartbeats::Answer(Connection& conn) { SendBeat(conn, Kind::kPong); }

void Heartbeats::Start() {
  if (enabled_) timers_.After(liveness_.interval(), [this] { Tick(); });
}

void Heartbeats::Tick() {
  if (closed_()) return;
  std::vector<std::pair<int, std::shared_ptr<Connection>>> connected = peers_.Connected();
  std::vector<int> ranks;
  ranks.reserve(connected.size());
  for (const auto& [rank, conn] : connected) ranks.push_back(rank);
  Liveness::Actions actions = liveness_.Tick(absl::Now(), ranks);
  pings_sent_.fetch_add(static_cast<int64_t>(actions.ping.size()), std::memory_order_relaxed);
  declared_dead_.fetch_add(static_cast<int64_t>(actions.dead.size()), std::memory_order_relaxed);
  // The dead first: closing a connection also frees a sender blocked on its full socket.
  for (int rank : actions.dead) {
    absl::Status why = UnavailableError(
        peers_.Describe(rank),
        absl::StrCat("declared dead by ", self_name_, ": nothing heard from it, not even a heartbeat answer, for ",
                     absl::FormatDuration(liveness_.timeout()),
                     " (frozen, its host down, or the network between them cut; AgentOptions::peer_timeout)"));
    std::fprintf(stderr, "gradwire: %s\n", std::string(why.message()).c_str());
    peers_.CloseRank(rank, why);  // the agent's close path fails its calls and tells every layer
  }
  std::vector<std::shared_ptr<Connection>> ping;
  for (int rank : actions.ping) {
    for (const auto& [r, conn] : connected) {
      if (r == rank) ping.push_back(conn);
    }
  }
  if (!ping.empty()) {
    (void)sender_.Post([ping = std::move(ping)] {
      for (const auto& conn : ping) SendBeat(*conn, Kind::kPing);
    });
  }
  timers_.After(liveness_.interval(), [this] { Tick(); });
}

}  // namespace gw::rpc::internal
