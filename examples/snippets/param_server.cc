// README "Parameter servers": the server role, a trainer's client, dense and sparse
// tables, and (elastic jobs) trainers and servers that join and leave.
// [START include]
#include <gradwire/param_server/client.h>
// [END include]

#include <cstdint>
#include <memory>

#include <gradwire/param_server/server.h>

namespace snippets::param_server {

// What the README's comment says the server ranks run in the `setup` of Agent::Start.
absl::Status Setup(gw::rpc::Agent& self) {
  return gw::param_server::ParameterServer::Install(self, {.checkpoint_dir = "ckpt", .checkpoint_keep = 3}).status();
}

void Example(absl::StatusOr<std::shared_ptr<gw::rpc::Agent>>& agent, const gw::Tensor& w, const gw::Tensor& grad,
             int64_t clock, const gw::Tensor& ids, const gw::Tensor& row_grads) {
// [START body]

// On the server ranks, in setup (checkpoints optional; the directory shared by the servers):
//   gw::param_server::ParameterServer::Install(self, {.checkpoint_dir = "ckpt", .checkpoint_keep = 3});
gw::param_server::Client ps(**agent, {"worker0", "worker1"}, /*trainer=*/0, /*trainers=*/2,
                            {.reconnect_timeout = absl::Seconds(60),       // wait out a server restart
                             .checkpoint_every = absl::Minutes(5)});       // this trainer cuts the checkpoints
absl::Status created = ps.CreateDense("fc1.weight", w, gw::optim::Sgd{.lr = 0.05, .momentum = 0.9},
                                      gw::param_server::Consistency::kSync);  // sharded over both servers
int64_t step = ps.Resume()->step;  // 0, or the step of the checkpoint the servers restored
gw::Tensor now = *ps.Pull("fc1.weight", step).Get();
auto next = ps.PushPullMany({"fc1.weight"}, step, {grad});  // the next step's values

// Sparse (embedding) tables: rows by 64-bit id, created on first touch from a seeded
// initializer, optionally bounded with LRU eviction; the optimizer updates only pushed rows.
created.Update(ps.CreateSparse("emb", /*dim=*/64,
                               {.init = {gw::param_server::RowInit::Kind::kNormal, 0, 1, /*seed=*/7},
                                .capacity = 0},
                               gw::optim::Adagrad{.lr = 0.1}, gw::param_server::Consistency::kAsync));
gw::Tensor rows = *ps.PullRows("emb", clock, ids).Get();   // ids: int64 [n] -> [n, 64]
gw::Future<bool> pushed = ps.PushRows("emb", clock, ids, row_grads);  // duplicates are summed
auto written = ps.Checkpoint();  // every table of every server at one step: a numbered version
// [END body]
}

void Elastic(gw::param_server::Client& ps) {
// [START elastic]
// A trainer that joins: its index is new; it takes part from the returned clock on.
int64_t clock = *ps.Join(std::vector<std::string>{"fc1.weight", "fc1.bias"});  // sync: the next step boundary
// ...                                                    pull `clock`, push it, ...
absl::Status left = ps.Leave("fc1.weight", /*last_clock=*/clock - 1);  // later steps stop waiting for it
// A server that joins (or an operator): move a table onto the servers it names.
absl::Status moved = ps.Reshard("fc1.weight", {"worker0", "worker1", "worker4"});
// [END elastic]
}

}  // namespace snippets::param_server
