// README "Collectives": the collectives layer installed in setup, a process group and
// its asynchronous collectives.
// [START include]
#include <gradwire/collectives/collectives.h>
// [END include]

#include <memory>

namespace snippets::collectives {

void Example(const gw::Tensor& grad, const gw::Tensor& x) {
// [START body]

std::shared_ptr<gw::collectives::Collectives> coll;
auto agent = gw::rpc::Agent::Start(*gw::rpc::AgentOptions::FromEnv(), [&](gw::rpc::Agent& a) {
  return gw::rpc::Assign(gw::collectives::Collectives::Install(a), coll);   // in setup
});
auto world = *coll->NewGroup();                      // every worker; NewGroup({0, 2}) a sub-group
gw::Future<gw::Tensor> done = world->AllReduce(grad, gw::collectives::ReduceOp::kAvg);  // in place
// ... compute meanwhile: collectives run on the group's own thread, in issue order ...
done.Get().value();
auto parts = world->AllGather(x).Get();              // also Broadcast, ReduceScatter, AllToAll, Barrier
// [END body]
}

}  // namespace snippets::collectives
