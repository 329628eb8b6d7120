// Internal: Peers, an agent's connections to the other workers of its group.
//
// Contract
//   - The workers are those of `members` (members.h): SetWorkers records the group found
//     at Start (by rank; for a worker that joined later, every member it found), and a
//     worker that joins later is admitted by its hello, which carries its record (rank,
//     name, address, pid), and reported through events.joined.
//   - events.connected(rank) runs whenever a new connection to `rank` is identified (dialled
//     by this worker, or its hello accepted): the failure detector counts it as hearing.
//   - Outgoing(rank) returns the connection this worker calls `rank` on: the one it has,
//     else one the peer dialled (both ends send calls and replies on a connection, so two
//     workers that call each other use one connection, unless both dial at the same
//     moment), else a new one, dialled (one dial per peer at a time) with the hello as its
//     first message. When the dial fails it
//     re-reads the peer's record from the rendezvous (a worker restarted under the same
//     rank announces a new address) and tries that once; then UNAVAILABLE naming the peer.
//   - Every connection opens with a hello each way (HelloMessage: rank, name, protocol
//     version): the dialler sends its own first, the acceptor answers with its own.
//     OnHello checks the peer: its version must lie in [kMinProtocolVersion,
//     kProtocolVersion] (message.h), and Members::Admit its rank and name (a rank of the
//     group must match its record, a new rank is a worker that joined). A peer
//     that fails is refused with FAILED_PRECONDITION naming both versions (or the
//     mismatch): the acceptor sends the refusal back and closes once it is sent; the
//     dialler closes its side with the refusal as the reason, so its calls to that peer
//     fail with it.
//   - RankOf(conn) is the peer of an identified connection, -1 before its hello.
//   - Forget(conn) drops a closed connection; it returns the peer's rank (-1 if it was
//     never identified) and whether this worker called that peer on it.
//   - Connected() lists one open identified connection per peer that has any (our
//     outgoing one first): what the failure detector watches and pings (liveness.h).
//     CloseRank(rank, reason) closes every connection to that peer (declared dead).
//   - Thread-safe.
#ifndef GRADWIRE_RPC_SRC_CLUSTER_PEERS_H_
#define GRADWIRE_RPC_SRC_CLUSTER_PEERS_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cluster/members.h"
#include "cluster/rendezvous.h"
#include "gradwire/rpc/message.h"
#include "gradwire/rpc/transport.h"
#include "gradwire/rpc/worker.h"
#include "wire/codec.h"

namespace gw::rpc::internal {

// The first message of each direction of every connection: who is speaking (a worker
// that joined a running group is known by it).
struct HelloMessage {
  int64_t rank = -1;
  std::string name;
  int64_t protocol_version = 0;
  std::string address;  // where it listens
  int64_t pid = 0;
  static constexpr auto Fields() {
    return std::make_tuple(Field("rank", &HelloMessage::rank), Field("name", &HelloMessage::name),
                           Field("protocol_version", &HelloMessage::protocol_version),
                           Field("address", &HelloMessage::address), Field("pid", &HelloMessage::pid));
  }
};

class Peers {
 public:
  struct Events {
    std::function<void(const WorkerInfo&)> joined;  // on the I/O thread that read its hello
    std::function<void(int rank)> connected;        // quick: on the dialling or I/O thread
  };
  Peers(const WorkerInfo& self, Members& members, Transport& transport, Rendezvous& rendezvous,
        ConnectionCallbacks callbacks, Events events)
      : self_(self),
        members_(members),
        transport_(transport),
        rendezvous_(rendezvous),
        callbacks_(std::move(callbacks)),
        events_(std::move(events)),
        dial_mu_(static_cast<size_t>(members.capacity())),
        outgoing_(static_cast<size_t>(members.capacity())) {}

  // `workers`: Start's group, by rank (those that left since included, for their names).
  void SetWorkers(std::vector<WorkerInfo> workers);
  // REQUIRES: after SetWorkers.
  const std::vector<WorkerInfo>& workers() const { return workers_; }
  // "worker1 (rank 1)", or "rank 7" for a rank outside the group.
  std::string Describe(int rank) const;
  std::string Name(int rank) const { return members_.Name(rank); }

  // The callbacks every connection of this agent reports through (for Listen too).
  const ConnectionCallbacks& callbacks() const { return callbacks_; }
  absl::StatusOr<std::shared_ptr<Connection>> Outgoing(int rank);
  // Handles a hello (or a refusal) that arrived on `conn`. On error the caller closes the
  // connection with it (the acceptor's refusal is already on its way to the peer).
  absl::Status OnHello(const std::shared_ptr<Connection>& conn, const Envelope& hello);
  int RankOf(const Connection* conn) const;
  std::pair<int, bool> Forget(const std::shared_ptr<Connection>& conn);
  std::vector<std::pair<int, std::shared_ptr<Connection>>> Connected() const;
  void CloseRank(int rank, const absl::Status& reason);
  void CloseAll();

 private:
  absl::StatusOr<Message> EncodeHello(const absl::Status& refusal) const;
  absl::Status Check(const Envelope& hello, HelloMessage* peer, bool* joined);

  const WorkerInfo& self_;
  Members& members_;
  Transport& transport_;
  Rendezvous& rendezvous_;
  const ConnectionCallbacks callbacks_;
  const Events events_;
  // Written once by SetWorkers (before members_ is known), then read-only.
  std::vector<WorkerInfo> workers_;
  std::vector<absl::Mutex> dial_mu_;  // one per rank

  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<Connection>> outgoing_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, std::string> dial_address_ ABSL_GUARDED_BY(mu_);  // a restarted worker's new one
  // Identified connections, both directions (held weakly: the transport owns them).
  struct Identified {
    int rank;
    std::weak_ptr<Connection> conn;
  };
  absl::flat_hash_map<const Connection*, Identified> rank_of_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gw::rpc::internal

#endif  // GRADWIRE_RPC_SRC_CLUSTER_PEERS_H_
