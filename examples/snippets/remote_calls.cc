// README "Remote calls": an agent per process, a registered function, calls to a peer.
// The README shows the regions between the [START] and [END] lines (scripts/check-readme).
// [START include]
#include <gradwire/rpc/agent.h>
#include <gradwire/tensor/kernels.h>   // gw::kernels: math without autograd
// [END include]

namespace snippets::remote_calls {

void Example(const gw::Tensor& a, const gw::Tensor& b) {
// [START body]

// In every process, e.g. started by `gradwire launch -n 2 ./my_program`
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; torchrun's variables work too).
auto options = gw::rpc::AgentOptions::FromEnv();
auto agent = gw::rpc::Agent::Start(*options, [](gw::rpc::Agent& self) {
  // Registered before this worker is announced, so no peer can call too early.
  (void)self.Register("add", [](gw::Tensor a, gw::Tensor b) { return gw::kernels::Add(a, b); });
});                                                       // returns once everyone joined

absl::StatusOr<gw::Tensor> sum = (*agent)->Sync<gw::Tensor>("worker1", "add", a, b);
gw::Future<gw::Tensor> later = (*agent)->Async<gw::Tensor>(
    "worker1", "add", a, b, gw::rpc::CallOptions{.timeout = absl::Seconds(5)});
absl::Status done = (*agent)->Shutdown();               // graceful: everyone agrees
// [END body]
}

}  // namespace snippets::remote_calls
