// AgentGroup: agents on threads of one process, sharing a fresh store (tests only).
#include "agent_group.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gw::rpc::testing {

std::unique_ptr<AgentGroup> AgentGroup::Start(int n, Setup register_fn, AgentOptions base, PerRank per_rank) {
  auto group = std::make_unique<AgentGroup>();
  if (absl::StartsWith(base.rendezvous, "etcd://")) {
    group->store_address_ = base.rendezvous;  // nobody hosts it
  } else {
    // The store authenticates its clients by the job's secret, as the agents' would.
    Security security = base.security;
    if (security.secret.empty()) security.secret = Security::FromEnv().value_or(Security{}).secret;
    auto server = StoreServer::Start("127.0.0.1", 0, security);
    if (!server.ok()) {
      ADD_FAILURE() << server.status();
      return nullptr;
    }
    group->store_ = std::move(*server);
    group->store_address_ = group->store_->address();
  }
  std::vector<absl::StatusOr<std::shared_ptr<Agent>>> results(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      AgentOptions o = base;
      o.rank = r;
      o.world_size = n;
      o.rendezvous = group->store_address_;
      o.host_store = false;
      if (per_rank) per_rank(r, o);
      results[static_cast<size_t>(r)] = Agent::Start(o, register_fn);
    });
  }
  for (auto& t : threads) t.join();
  for (auto& r : results) {
    if (!r.ok()) {
      ADD_FAILURE() << r.status();
      return nullptr;
    }
    group->agents_.push_back(*r);
  }
  return group;
}

absl::Status AgentGroup::AwaitRRefsReleased(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  auto empty = [](const RRefStats& s) { return s.owned == 0 && s.users == 0 && s.pending_control == 0; };
  std::vector<std::string> busy;
  for (const auto& agent : agents_) {
    if (agent->AwaitRRefs(empty, deadline)) continue;
    const RRefStats s = agent->rref_stats();
    busy.push_back(absl::StrCat(agent->self().name, ": owned=", s.owned, " forks=", s.owner_forks,
                                " local=", s.owner_local, " users=", s.users, " pending=", s.pending_control));
  }
  if (busy.empty()) return absl::OkStatus();
  return absl::DeadlineExceededError(
      absl::StrCat("RRef tables not empty after ", absl::FormatDuration(timeout), ": ", absl::StrJoin(busy, "; ")));
}

std::shared_ptr<FaultInjector> InjectFaults(absl::string_view spec) {
  absl::StatusOr<FaultSpec> parsed = ParseFaults(spec);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return std::make_shared<FaultInjector>(parsed.ok() ? *std::move(parsed) : FaultSpec{});
}

void ExpectRepairedWithoutCloses(const FaultInjector& faults) {
  const FaultStats stats = faults.stats();
  EXPECT_GT(stats.dropped, 0u) << stats.ToString();
  EXPECT_GT(stats.retransmitted, 0u) << stats.ToString();
  EXPECT_GT(stats.duplicates_discarded, 0u) << stats.ToString();
  EXPECT_EQ(stats.connections_closed, 0u) << stats.ToString();
}

AgentGroup::~AgentGroup() {
  agents_.clear();
  if (store_) store_->Shutdown();
}

std::shared_ptr<Agent> AgentGroup::Join(Setup setup, AgentOptions base) const {
  base.join = true;
  base.rendezvous = store_address_;
  base.host_store = false;
  absl::StatusOr<std::shared_ptr<Agent>> agent = Agent::Start(base, std::move(setup));
  EXPECT_TRUE(agent.ok()) << agent.status();
  return agent.ok() ? *agent : nullptr;
}

absl::Status AgentGroup::ShutdownAll() {
  std::vector<absl::Status> results(agents_.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < agents_.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = agents_[i]->Shutdown(/*graceful=*/true); });
  }
  for (auto& t : threads) t.join();
  for (auto& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

pid_t SpawnSelf(const std::string& role, const std::map<std::string, std::string>& env) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::setenv("GW_TEST_ROLE", role.c_str(), 1);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    char exe[] = "/proc/self/exe";
    char* argv[] = {exe, nullptr};
    ::execv(exe, argv);
    ::_exit(127);
  }
  return pid;
}

int WaitForExit(pid_t pid) {
  int status = 0;
  for (int i = 0; i < 300; ++i) {  // at most 30 s
    if (::waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    absl::SleepFor(absl::Milliseconds(100));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

}  // namespace gw::rpc::testing
