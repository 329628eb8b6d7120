// Versioned checkpoints end to end (checkpoint.h), against real agents on loopback and
// real files: a crashed job restarted from its checkpoint ends bit for bit as one that
// never stopped; every version is one step of every table of every server; a server
// killed with SIGKILL at random points of its writes leaves only whole versions, and the
// newest comes back; every kind of damage is detected, named and passed over; a full disk
// fails the cuts naming the file, stops the job after the limit and keeps the last version.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent_group.h"
#include "rank_zero.h"
#include "gradwire/nn/serialize.h"
#include "gradwire/optim/functional.h"
#include "gradwire/param_server/client.h"
#include "gradwire/param_server/reader.h"
#include "gradwire/param_server/server.h"
#include "gradwire/tensor/generator.h"
#include "gradwire/tensor/kernels.h"
#include "manifest.h"
#include "scoped_temp_dir.h"
#include "versions.h"

namespace gw::param_server {
namespace {

namespace fs = std::filesystem;
using internal::CheckScope;
using internal::CheckVersion;
using internal::ListVersions;
using internal::Manifest;
using internal::ReadManifest;
using internal::VersionPath;
using rpc::testing::AgentGroup;
using rpc::testing::ScopedTempDir;

const std::vector<std::string> kTwoServers = {"worker0", "worker1"};

// Ranks 0 .. servers-1 are parameter servers installed with `options`; the others are
// trainers and readers.
struct Deployment {
  std::unique_ptr<AgentGroup> group;
  std::vector<std::shared_ptr<ParameterServer>> servers;

  static Deployment Start(int servers, int others, const ServerOptions& options) {
    Deployment d;
    d.servers.resize(static_cast<size_t>(servers));
    d.group = AgentGroup::Start(servers + others, [&](rpc::Agent& a) -> absl::Status {
      const int rank = a.self().rank;
      if (rank >= servers) return absl::OkStatus();
      absl::StatusOr<std::shared_ptr<ParameterServer>> s = ParameterServer::Install(a, options);
      if (!s.ok()) return s.status();
      d.servers[static_cast<size_t>(rank)] = *s;
      return absl::OkStatus();
    });
    return d;
  }
  rpc::Agent& operator[](int rank) { return (*group)[rank]; }
};

Tensor Ids(const std::vector<int64_t>& ids) { return Tensor::FromVector(ids, {static_cast<int64_t>(ids.size())}); }

// Equal bit for bit (NaN included), float32.
::testing::AssertionResult BitEqual(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return ::testing::AssertionFailure() << "undefined tensor";
  const Tensor x = kernels::Contiguous(a), y = kernels::Contiguous(b);
  if (x.dtype() != DType::kFloat32 || y.dtype() != DType::kFloat32 || x.numel() != y.numel()) {
    return ::testing::AssertionFailure() << "not two float32 tensors of one size (" << x.numel() << " and "
                                         << y.numel() << " values)";
  }
  for (int64_t i = 0; i < x.numel(); ++i) {
    uint32_t u = 0, v = 0;
    std::memcpy(&u, x.data<float>() + i, 4);
    std::memcpy(&v, y.data<float>() + i, 4);
    if (u != v) {
      return ::testing::AssertionFailure() << "value " << i << " differs: " << x.data<float>()[i] << " vs "
                                           << y.data<float>()[i];
    }
  }
  return ::testing::AssertionSuccess();
}

bool Contains(absl::string_view text, absl::string_view part) { return text.find(part) != absl::string_view::npos; }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

void FlipBit(const std::string& path, size_t offset, int bit) {
  std::string bytes = ReadAll(path);
  ASSERT_LT(offset, bytes.size()) << path;
  bytes[offset] = static_cast<char>(bytes[offset] ^ (1 << bit));
  WriteAll(path, bytes);
}

// Where entry `name`'s element data begins in a tensor file (nn/serialize.h, version 2).
size_t EntryData(const std::string& path, const std::string& name) {
  const std::string b = ReadAll(path);
  auto u64 = [&](size_t at) {
    uint64_t v = 0;
    std::memcpy(&v, b.data() + at, 8);
    return v;
  };
  auto u32 = [&](size_t at) {
    uint32_t v = 0;
    std::memcpy(&v, b.data() + at, 4);
    return v;
  };
  if (b.size() < 16 || b.compare(0, 4, "GWTF") != 0 || u32(4) != 2) return std::string::npos;
  const uint64_t count = u64(8);
  size_t at = 16;
  for (uint64_t e = 0; e < count && at + 4 <= b.size(); ++e) {
    const uint32_t name_len = u32(at);
    const std::string entry = b.substr(at + 4, name_len);
    size_t p = at + 4 + name_len + 1;  // dtype
    const uint8_t ndim = static_cast<uint8_t>(b[p]);
    p += 1 + 8 * ndim;
    const uint64_t nbytes = u64(p);
    p += 8;
    if (entry == name) return p;
    at = p + nbytes + 4;  // the data, then the entry's CRC
  }
  return std::string::npos;
}

// Every file under `dir`, relative to it, sorted; directories end with '/'.
std::vector<std::string> Listing(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    out.push_back(fs::relative(e.path(), dir).string() + (e.is_directory() ? "/" : ""));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A port nobody listens on, for a store this process hosts as rank 0.
int FreePort() {
  auto probe = rpc::StoreServer::Start("127.0.0.1", 0);
  if (!probe.ok()) return 0;
  const int port = (*probe)->port();
  (*probe)->Shutdown();
  return port;
}

// ------------------------------------------------------------------------------------
// 1. A job that crashed after a checkpoint, restarted on its directory, resumes at the
//    checkpoint's step and ends bit for bit as a job that ran straight through; a trainer
//    that does not resume is refused and trains nothing into the tables.

constexpr int64_t kDim = 3;
const Shape kW{6, 5}, kB{7};

struct Step {  // one trainer's gradients of one step
  Tensor w, b, ids, rows;
};

struct Tables {
  Tensor w, b, emb;  // emb: the rows of kAllIds
};

TEST(CheckpointVersionsTest, ACrashedJobResumesFromItsCheckpointBitForBitAsIfItNeverStopped) {
  constexpr int64_t kN = 4;
  const ScopedTempDir scoped("ckv_resume");
  ASSERT_TRUE(scoped.ok());
  const std::string dir = scoped.path();
  Generator init(11);
  const Tensor w0 = Tensor::Randn(kW, init), b0 = Tensor::Randn(kB, init);
  const optim::Sgd momentum{.lr = 0.05, .momentum = 0.9};
  const optim::Sgd nesterov{.lr = 0.1, .momentum = 0.5, .weight_decay = 0.01, .nesterov = true};
  const optim::Adagrad adagrad{.lr = 0.2};
  const SparseOptions emb_options{RowInit{RowInit::Kind::kNormal, 0, 0.5, 17}};
  // Every trainer's gradients of steps 0 .. 2N-1, from one seeded generator; rows of 12
  // ids (duplicates within a push are summed by the server).
  std::vector<std::array<Step, 2>> grads;
  Generator gen(29);
  for (int64_t s = 0; s < 2 * kN; ++s) {
    std::array<Step, 2> both;
    for (Step& g : both) {
      std::vector<int64_t> ids;
      for (int i = 0; i < 5; ++i) ids.push_back(static_cast<int64_t>(gen.NextBelow(12)));
      g = {Tensor::Randn(kW, gen), Tensor::Randn(kB, gen), Ids(ids), Tensor::Randn({5, kDim}, gen)};
    }
    grads.push_back(both);
  }
  std::vector<int64_t> all;
  for (int64_t id = 0; id < 12; ++id) all.push_back(id);
  const Tensor all_ids = Ids(all);

  auto create = [&](Client& c) {
    ASSERT_TRUE(c.CreateDense("w", w0, momentum, Consistency::kSync).ok());
    ASSERT_TRUE(c.CreateDense("b", b0, nesterov, Consistency::kSync).ok());
    ASSERT_TRUE(c.CreateSparse("emb", kDim, emb_options, adagrad, Consistency::kSync).ok());
  };
  auto step = [&](Client& c0, Client& c1, int64_t s) {
    const auto& g = grads[static_cast<size_t>(s)];
    Future<std::vector<Tensor>> a = c0.PushPullMany({"w", "b"}, s, {g[0].w, g[0].b});
    Future<std::vector<Tensor>> b = c1.PushPullMany({"w", "b"}, s, {g[1].w, g[1].b});
    Future<bool> ra = c0.PushRows("emb", s, g[0].ids, g[0].rows);
    Future<bool> rb = c1.PushRows("emb", s, g[1].ids, g[1].rows);
    ASSERT_TRUE(ra.Get().ok()) << ra.Get().status();
    ASSERT_TRUE(rb.Get().ok()) << rb.Get().status();
    absl::StatusOr<std::vector<Tensor>> x = a.Get(), y = b.Get();
    ASSERT_TRUE(x.ok()) << x.status();
    ASSERT_TRUE(y.ok()) << y.status();
    for (size_t t = 0; t < 2; ++t) EXPECT_TRUE(BitEqual((*x)[t], (*y)[t])) << "both trainers see step " << s + 1;
  };
  auto values = [&](Client& c, int64_t at) -> Tables {
    absl::StatusOr<Tensor> w = c.Pull("w", at).Get(), b = c.Pull("b", at).Get(),
                           emb = c.PullRows("emb", at, all_ids).Get();
    EXPECT_TRUE(w.ok() && b.ok() && emb.ok()) << w.status() << b.status() << emb.status();
    if (!w.ok() || !b.ok() || !emb.ok()) return {};
    return {*w, *b, *emb};
  };
  auto expect_equal = [](const Tables& x, const Tables& y, const std::string& what) {
    EXPECT_TRUE(BitEqual(x.w, y.w)) << what << ": w";
    EXPECT_TRUE(BitEqual(x.b, y.b)) << what << ": b";
    EXPECT_TRUE(BitEqual(x.emb, y.emb)) << what << ": emb";
  };

  // Job A: 2N steps straight through (no checkpoints).
  Tables a_at_n, a_at_2n;
  {
    Deployment a = Deployment::Start(2, 2, {});
    ASSERT_NE(a.group, nullptr);
    Client c0(a[2], kTwoServers, 0, 2), c1(a[3], kTwoServers, 1, 2);
    create(c0);
    create(c1);
    for (int64_t s = 0; s < kN; ++s) ASSERT_NO_FATAL_FAILURE(step(c0, c1, s));
    a_at_n = values(c0, kN);
    for (int64_t s = kN; s < 2 * kN; ++s) ASSERT_NO_FATAL_FAILURE(step(c0, c1, s));
    a_at_2n = values(c0, 2 * kN);
    ASSERT_TRUE(a_at_2n.w.defined());
    EXPECT_TRUE(a.group->ShutdownAll().ok());
  }

  // Job B: N steps, a checkpoint at step N, two more steps and half of a third, then a
  // crash: the agents go without a graceful shutdown, and that work is lost.
  CheckpointInfo cut;
  {
    Deployment b = Deployment::Start(2, 2, {.checkpoint_dir = dir});
    ASSERT_NE(b.group, nullptr);
    Client c0(b[2], kTwoServers, 0, 2), c1(b[3], kTwoServers, 1, 2);
    create(c0);
    create(c1);
    for (int64_t s = 0; s < kN; ++s) ASSERT_NO_FATAL_FAILURE(step(c0, c1, s));
    absl::StatusOr<CheckpointInfo> written = c0.Checkpoint().Get();
    ASSERT_TRUE(written.ok()) << written.status();
    cut = *written;
    EXPECT_EQ(cut.version, 1);
    EXPECT_EQ(cut.step, kN);
    EXPECT_FALSE(cut.job.empty());
    EXPECT_EQ(cut.files, (std::vector<std::string>{"worker0.gwps", "worker1.gwps"}));
    for (int64_t s = kN; s < kN + 2; ++s) ASSERT_NO_FATAL_FAILURE(step(c0, c1, s));
    const auto& g = grads[static_cast<size_t>(kN + 2)];
    ASSERT_TRUE(c0.Push("w", kN + 2, g[0].w).Get().ok());
    ASSERT_TRUE(c0.PushRows("emb", kN + 2, g[0].ids, g[0].rows).Get().ok());
  }  // the clients, then the agents: Shutdown(graceful=false)

  // Job C: servers on B's directory.
  Deployment c = Deployment::Start(2, 2, {.checkpoint_dir = dir});
  ASSERT_NE(c.group, nullptr);
  for (const auto& server : c.servers) {
    const RestoredCheckpoint& r = server->restored();
    EXPECT_EQ(r.version, 1);
    EXPECT_EQ(r.step, kN);
    EXPECT_EQ(r.job, cut.job);
    EXPECT_EQ(r.path, VersionPath(dir, 1));
    EXPECT_EQ(r.tables, 3);
    EXPECT_TRUE(r.skipped.empty()) << absl::StrJoin(r.skipped, "; ");
  }
  {
    // A trainer that does not resume starts at step 0: refused, naming the steps and the
    // way out, and the tables stay as restored.
    Client stray(c[2], kTwoServers, 0, 2);
    create(stray);
    const auto& g = grads[0];
    auto expect_refused = [&](const absl::Status& s, const std::string& what) {
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << what << ": " << s;
      EXPECT_TRUE(Contains(s.message(), "push of step 0 by trainer 0, but the table is at step 4 (restored from a "
                                        "checkpoint)"))
          << what << ": " << s;
      EXPECT_TRUE(Contains(s.message(), "Client::Resume")) << what << ": " << s;
    };
    expect_refused(stray.Push("w", 0, g[0].w).Get().status(), "Push");
    expect_refused(stray.PushRows("emb", 0, g[0].ids, g[0].rows).Get().status(), "PushRows");
    expect_refused(stray.PushPullMany({"w", "b"}, 0, {g[0].w, g[0].b}).Get().status(), "PushPullMany");
    const Reader reader(c[3], kTwoServers);
    absl::StatusOr<TablesSnapshot> now = reader.Read({"w", "b"}, {kW, kB}).Get();
    ASSERT_TRUE(now.ok()) << now.status();
    EXPECT_TRUE(BitEqual(now->values[0], a_at_n.w)) << "w after the refused pushes";
    EXPECT_TRUE(BitEqual(now->values[1], a_at_n.b)) << "b after the refused pushes";
    EXPECT_EQ(now->steps, (std::vector<int64_t>{kN, kN}));
    EXPECT_TRUE(now->consistent());
    absl::StatusOr<Tensor> rows = stray.PullRows("emb", kN, all_ids).Get();
    ASSERT_TRUE(rows.ok()) << rows.status();
    EXPECT_TRUE(BitEqual(*rows, a_at_n.emb)) << "emb after the refused pushes";
    absl::StatusOr<TablesSnapshot> saved = Reader::LoadCheckpoint(dir, {"w", "b"}, {kW, kB});
    ASSERT_TRUE(saved.ok()) << saved.status();
    EXPECT_TRUE(BitEqual(saved->values[0], a_at_n.w));
    EXPECT_TRUE(BitEqual(saved->values[1], a_at_n.b));
  }
  Client c0(c[2], kTwoServers, 0, 2), c1(c[3], kTwoServers, 1, 2);
  create(c0);
  create(c1);
  for (Client* t : {&c0, &c1}) {
    absl::StatusOr<ResumePoint> resume = t->Resume();
    ASSERT_TRUE(resume.ok()) << resume.status();
    EXPECT_EQ(resume->version, 1);
    EXPECT_EQ(resume->step, kN);
    EXPECT_EQ(resume->job, cut.job);
  }
  expect_equal(values(c0, kN), a_at_n, "job C at the step it resumed from");
  for (int64_t s = kN; s < 2 * kN; ++s) ASSERT_NO_FATAL_FAILURE(step(c0, c1, s));
  expect_equal(values(c0, 2 * kN), a_at_2n, "job C at step 2N (trainer 0)");
  expect_equal(values(c1, 2 * kN), a_at_2n, "job C at step 2N (trainer 1)");
  EXPECT_TRUE(c.group->ShutdownAll().ok());
}

// ------------------------------------------------------------------------------------
// 2. Periodic versions of three synchronous tables pushed together by two trainers: each
//    is one step of every table on every server, and holds exactly the values the
//    trainers were answered at that step.

TEST(CheckpointVersionsTest, EveryPeriodicVersionIsOneStepOfEveryTableOnEveryServer) {
  const ScopedTempDir scoped("ckv_cut");
  ASSERT_TRUE(scoped.ok());
  const std::string dir = scoped.path();
  Deployment d = Deployment::Start(2, 2, {.checkpoint_dir = dir, .checkpoint_keep = 1000});
  ASSERT_NE(d.group, nullptr);
  Client c0(d[2], kTwoServers, 0, 2, ClientOptions{.checkpoint_every = absl::Milliseconds(3)});
  Client c1(d[3], kTwoServers, 1, 2);
  const std::vector<std::string> names = {"a", "b", "c"};
  const std::vector<Shape> shapes = {{5, 4}, {9}, {3}};
  const std::vector<optim::OptimizerConfig> optimizers = {optim::Sgd{.lr = 0.1, .momentum = 0.9},
                                                         optim::Adam{.lr = 0.01}, optim::Sgd{.lr = 0.5}};
  Generator gen(5);
  std::vector<Tensor> initial;
  for (const Shape& s : shapes) initial.push_back(Tensor::Randn(s, gen));
  for (Client* c : {&c0, &c1}) {
    for (size_t t = 0; t < names.size(); ++t) {
      ASSERT_TRUE(c->CreateDense(names[t], initial[t], optimizers[t], Consistency::kSync).ok());
    }
  }
  // The tables as the trainers were answered at each step (PushPullMany of step s returns
  // them at step s + 1).
  std::map<int64_t, std::vector<Tensor>> at = {{0, initial}};
  auto written = [&] {
    return std::min(d.servers[0]->checkpoint_stats().written, d.servers[1]->checkpoint_stats().written);
  };
  int64_t step = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  while ((written() < 10 || step < 30) && absl::Now() < deadline) {
    std::vector<Tensor> g0, g1;
    for (const Shape& s : shapes) g0.push_back(Tensor::Randn(s, gen));
    for (const Shape& s : shapes) g1.push_back(Tensor::Randn(s, gen));
    Future<std::vector<Tensor>> f0 = c0.PushPullMany(names, step, g0);
    Future<std::vector<Tensor>> f1 = c1.PushPullMany(names, step, g1);
    absl::StatusOr<std::vector<Tensor>> r0 = f0.Get(), r1 = f1.Get();
    ASSERT_TRUE(r0.ok()) << r0.status();
    ASSERT_TRUE(r1.ok()) << r1.status();
    ++step;
    std::vector<Tensor>& kept = at[step];
    for (const Tensor& t : *r0) kept.push_back(kernels::Clone(t));
  }
  ASSERT_GE(written(), 10) << "periodic versions in 15 s";
  // Each server counted each complete version (once the cut under way when the pushes
  // stopped has completed, the counts and the manifests agree). A version
  // without a manifest is one whose registration was refused by a server the other
  // trainer had taken past the planned step (the client plans it again as the next
  // version): never read, and removed by a later commit.
  auto complete = [&] {
    std::vector<int64_t> out;
    for (int64_t v : ListVersions(dir)) {
      if (fs::exists(VersionPath(dir, v) + "/MANIFEST")) out.push_back(v);
    }
    return out;
  };
  auto settled = [&] {
    const int64_t n = static_cast<int64_t>(complete().size());
    return d.servers[0]->checkpoint_stats().written == n && d.servers[1]->checkpoint_stats().written == n;
  };
  (void)c0.LastCheckpoint().Get();
  ASSERT_TRUE(settled()) << "versions: " << absl::StrJoin(Listing(dir), " ");
  for (const auto& server : d.servers) {
    EXPECT_EQ(server->checkpoint_stats().failed, 0) << server->checkpoint_stats().last_error;
  }
  const std::vector<int64_t> versions = complete();
  int64_t later_step = std::numeric_limits<int64_t>::max();
  for (int64_t v : versions) {  // newest first
    SCOPED_TRACE(absl::StrCat("version ", v));
    const std::string path = VersionPath(dir, v);
    absl::StatusOr<Manifest> m = ReadManifest(path);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->version, v);
    EXPECT_LE(m->step, later_step) << "a version is not an earlier step than the one before it";
    later_step = m->step;
    ASSERT_EQ(m->files.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      const internal::ManifestFile& f = m->files[i];
      EXPECT_EQ(f.server, kTwoServers[i]);
      EXPECT_EQ(f.name, kTwoServers[i] + ".gwps");
      ASSERT_EQ(f.shards.size(), names.size());
      for (const internal::ManifestShard& s : f.shards) {
        EXPECT_EQ(s.consistency, static_cast<int>(Consistency::kSync)) << s.table;
        EXPECT_EQ(s.clock, m->step) << "table " << s.table << " on " << f.server;
        EXPECT_EQ(s.updates, m->step) << "table " << s.table << " on " << f.server;
      }
    }
    EXPECT_EQ(m->tables.size(), names.size());
    EXPECT_TRUE(CheckVersion(path, *m, CheckScope::kAll).ok()) << CheckVersion(path, *m, CheckScope::kAll);
    absl::StatusOr<TablesSnapshot> loaded = Reader::LoadCheckpoint(path, names, shapes);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_TRUE(loaded->consistent());
    EXPECT_EQ(loaded->steps, std::vector<int64_t>(names.size(), m->step));
    ASSERT_TRUE(at.contains(m->step)) << m->step;
    for (size_t t = 0; t < names.size(); ++t) {
      EXPECT_TRUE(BitEqual(loaded->values[t], at[m->step][t])) << "table " << names[t] << " at step " << m->step;
    }
  }
  std::printf("%zu versions of %lld steps, each one step of 3 tables on 2 servers\n", versions.size(),
              static_cast<long long>(step));
  EXPECT_TRUE(d.group->ShutdownAll().ok());
}

// ------------------------------------------------------------------------------------
// 3. A server process killed with SIGKILL at random moments while a client cuts versions
//    in a tight loop and two trainers push: after each kill every version with a manifest
//    is whole and loads, and the restarted server restores the newest of them.
//
//    Each round is the job restarted: a store on a new port, this process as rank 0 (the
//    trainers' clients and the cutting client) and the server process as rank 1, on the
//    same checkpoint directory. (Keeping rank 0 up across the server's restarts would
//    cost every round 2 s: an agent first redials a dead worker's old address until its
//    dial timeout, peers.cc kDialTimeout, before it looks the new one up.)

using testing::StartRankZero;  // rank_zero.h

// SIGKILL, then the exit status (128 + signal) once the process is gone.
int KillAndReap(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(CheckpointVersionsTest, SigkillAtRandomPointsOfWritesLeavesWholeVersionsAndTheNewestIsRestored) {
  constexpr int kRounds = 10;
  const ScopedTempDir scoped("ckv_kill");
  ASSERT_TRUE(scoped.ok());
  const std::string dir = scoped.path();
  const std::vector<std::string> server_names = {"worker1"};
  const Shape w_shape{40, 10}, b_shape{16};
  Generator gen(3);
  const Tensor w_init = Tensor::Randn(w_shape, gen), b_init = Tensor::Randn(b_shape, gen);
  const Tensor gw = Tensor::Randn(w_shape, gen), gb = Tensor::Randn(b_shape, gen);
  std::mt19937_64 rng(20240611);
  std::uniform_int_distribution<int> delay_ms(0, 200);

  int64_t expected_version = 0, expected_step = 0;  // the newest whole version after the last kill
  int64_t cuts = 0, kills_with_a_partial_version = 0;
  std::set<int64_t> seen_complete;
  for (int round = 0; round <= kRounds; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round, " (the newest whole version: ", expected_version, ")"));
    const int port = FreePort();
    ASSERT_GT(port, 0);
    const pid_t server = rpc::testing::SpawnSelf(
        "ps_server", {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                      {"MASTER_PORT", std::to_string(port)}, {"GW_PS_CHECKPOINT_DIR", dir}});
    std::shared_ptr<rpc::Agent> agent = StartRankZero(2, port);
    if (agent == nullptr) KillAndReap(server);
    ASSERT_NE(agent, nullptr) << "the server did not start (its stderr says why)";
    ASSERT_TRUE(agent->store().Wait({absl::StrCat("ready/worker1/", server)}, absl::Seconds(30)).ok());
    auto cutter = std::make_unique<Client>(*agent, server_names, 0, 2);
    auto c0 = std::make_unique<Client>(*agent, server_names, 0, 2);
    auto c1 = std::make_unique<Client>(*agent, server_names, 1, 2);
    for (Client* c : {cutter.get(), c0.get(), c1.get()}) {
      ASSERT_TRUE(c->CreateDense("w", w_init, optim::Sgd{.lr = 0.01, .momentum = 0.9}, Consistency::kSync).ok());
      ASSERT_TRUE(c->CreateDense("b", b_init, optim::Sgd{.lr = 0.01}, Consistency::kAsync).ok());
    }
    // What the restarted server restored: the newest whole version, exactly.
    absl::StatusOr<ResumePoint> resume = cutter->Resume();
    ASSERT_TRUE(resume.ok()) << resume.status();
    EXPECT_EQ(resume->version, expected_version);
    EXPECT_EQ(resume->step, expected_step);
    const Reader reader(*agent, server_names);
    absl::StatusOr<TablesSnapshot> now = reader.Read({"w", "b"}, {w_shape, b_shape}).Get();
    ASSERT_TRUE(now.ok()) << now.status();
    if (expected_version > 0) {
      absl::StatusOr<TablesSnapshot> saved =
          Reader::LoadCheckpoint(VersionPath(dir, expected_version), {"w", "b"}, {w_shape, b_shape});
      ASSERT_TRUE(saved.ok()) << saved.status();
      EXPECT_TRUE(BitEqual(now->values[0], saved->values[0])) << "w restored";
      EXPECT_TRUE(BitEqual(now->values[1], saved->values[1])) << "b restored";
      EXPECT_EQ(now->steps, saved->steps);
    } else {
      EXPECT_TRUE(BitEqual(now->values[0], w_init));
      EXPECT_TRUE(BitEqual(now->values[1], b_init));
    }
    if (round == kRounds) {
      cutter.reset();
      c0.reset();
      c1.reset();
      EXPECT_TRUE(agent->Shutdown().ok());
      EXPECT_EQ(rpc::testing::WaitForExit(server), 0);
      break;
    }

    // Train and cut until the kill; then this end of the job stops too (its calls end
    // with CANCELLED at once).
    std::atomic<bool> stop{false};
    std::atomic<int64_t> round_cuts{0};
    std::thread trainers([&, from = resume->step] {
      for (int64_t s = from; !stop.load(); ++s) {
        Future<std::vector<Tensor>> f0 = c0->PushPullMany({"w", "b"}, s, {gw, gb});
        Future<std::vector<Tensor>> f1 = c1->PushPullMany({"w", "b"}, s, {gw, gb});
        const bool ok0 = f0.Get(absl::Seconds(20)).ok(), ok1 = f1.Get(absl::Seconds(20)).ok();
        if (!ok0 || !ok1) return;  // the server is gone
      }
    });
    std::thread cutting([&] {
      while (!stop.load()) {
        absl::StatusOr<CheckpointInfo> cut = cutter->Checkpoint().Get(absl::Seconds(20));
        if (cut.ok()) ++round_cuts;
      }
    });
    absl::SleepFor(absl::Milliseconds(delay_ms(rng)));  // the random moment of the kill, not a wait for an event
    EXPECT_EQ(KillAndReap(server), 128 + SIGKILL);
    stop = true;
    // (A cut under way when the server died ends only after its abandonment was sent:
    // a call to the dead worker redials its old address for 2 s first.)
    trainers.join();
    cutting.join();
    cutter.reset();
    c0.reset();
    c1.reset();
    agent.reset();
    cuts += round_cuts.load();

    // Every version with a manifest is whole and loads; the others (cut short) are ignored.
    expected_version = 0;
    expected_step = 0;
    bool partial = false;
    for (int64_t v : ListVersions(dir)) {  // newest first
      const std::string path = VersionPath(dir, v);
      if (!fs::exists(path + "/MANIFEST")) {
        partial = true;
        continue;
      }
      absl::StatusOr<Manifest> m = ReadManifest(path);
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_EQ(m->version, v);
      const absl::Status whole = CheckVersion(path, *m, CheckScope::kAll);
      EXPECT_TRUE(whole.ok()) << whole << " (" << absl::StrJoin(Listing(dir), " ") << ")";
      absl::StatusOr<TablesSnapshot> loaded = Reader::LoadCheckpoint(path, {"w", "b"}, {w_shape, b_shape});
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      EXPECT_EQ(loaded->steps[0], m->step) << "w's updates at the version's step";
      seen_complete.insert(v);
      if (expected_version == 0) {
        expected_version = v;
        expected_step = m->step;
      }
    }
    for (const std::string& f : Listing(dir)) partial = partial || Contains(f, ".tmp");
    kills_with_a_partial_version += partial ? 1 : 0;
  }
  std::printf("%d kills: %lld versions committed, %zu different whole versions seen, %lld kills left a version "
              "or a file cut short\n",
              kRounds, static_cast<long long>(cuts), seen_complete.size(),
              static_cast<long long>(kills_with_a_partial_version));
  EXPECT_GE(seen_complete.size(), 3u) << "the kills must come while versions are written";
}

// A job killed while it wrote its first version leaves only a version without a
// manifest: the restarted servers start empty (naming it) instead of refusing to start,
// number their versions after it, and the first version they commit removes it.
TEST(CheckpointVersionsTest, AJobKilledWritingItsFirstVersionRestartsEmpty) {
  const ScopedTempDir scoped("ckv_first");
  ASSERT_TRUE(scoped.ok());
  const std::string dir = scoped.path();
  const std::string v1 = VersionPath(dir, 1);
  ASSERT_TRUE(fs::create_directories(v1));
  WriteAll(v1 + "/worker0.gwps", "a whole file of worker0");
  WriteAll(v1 + "/worker1.gwps.tmp", "half a file of worker1");
  Deployment d = Deployment::Start(2, 1, {.checkpoint_dir = dir});
  ASSERT_NE(d.group, nullptr) << "the servers refused to start";
  for (const auto& server : d.servers) {
    const RestoredCheckpoint& r = server->restored();
    EXPECT_EQ(r.version, 0);
    ASSERT_EQ(r.skipped.size(), 1u) << absl::StrJoin(r.skipped, "; ");
    EXPECT_EQ(r.skipped[0], absl::StrCat(v1, ": '", v1, "/MANIFEST' does not exist (an incomplete version)"));
  }
  Client c(d[2], kTwoServers, 0, 1);
  ASSERT_TRUE(c.CreateDense("w", Tensor::Ones({4}), optim::Sgd{.lr = 1}, Consistency::kSync).ok());
  absl::StatusOr<ResumePoint> resume = c.Resume();
  ASSERT_TRUE(resume.ok()) << resume.status();
  EXPECT_EQ(resume->version, 0);
  ASSERT_TRUE(c.Push("w", 0, Tensor::Ones({4})).Get().ok());
  absl::StatusOr<CheckpointInfo> cut = c.Checkpoint().Get();
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(cut->version, 2);
  EXPECT_EQ(Listing(dir), (std::vector<std::string>{"v00000002/", "v00000002/MANIFEST", "v00000002/worker0.gwps",
                                                    "v00000002/worker1.gwps"}));
  EXPECT_TRUE(d.group->ShutdownAll().ok());
}

// ------------------------------------------------------------------------------------
// 4. Every kind of damage to a version is detected and named, by the servers at start
//    (they pass over it to the version before) and by Reader::LoadCheckpoint.

const Shape kDamaged{10};

// Version 1 at step 2 and version 2 at step 4 of a synchronous table on two servers, in
// `dir`; the table's values at version 1.
Tensor WriteTwoVersions(const std::string& dir) {
  Deployment d = Deployment::Start(2, 1, {.checkpoint_dir = dir});
  EXPECT_NE(d.group, nullptr);
  if (d.group == nullptr) return {};
  Client c(d[2], kTwoServers, 0, 1);
  Generator gen(8);
  EXPECT_TRUE(c.CreateDense("w", Tensor::Randn(kDamaged, gen), optim::Sgd{.lr = 0.1, .momentum = 0.9},
                            Consistency::kSync)
                  .ok());
  Tensor at_v1;
  for (int64_t s = 0; s < 4; ++s) {
    EXPECT_TRUE(c.Push("w", s, Tensor::Randn(kDamaged, gen)).Get().ok());
    if (s == 1) {
      absl::StatusOr<CheckpointInfo> v1 = c.Checkpoint().Get();
      EXPECT_TRUE(v1.ok() && v1->version == 1 && v1->step == 2) << v1.status();
      at_v1 = *c.Pull("w", 2).Get();
    }
  }
  absl::StatusOr<CheckpointInfo> v2 = c.Checkpoint().Get();
  EXPECT_TRUE(v2.ok() && v2->version == 2 && v2->step == 4) << v2.status();
  EXPECT_TRUE(d.group->ShutdownAll().ok());
  return at_v1;
}

struct Damage {
  std::string what;
  std::function<void(const std::string& v1, const std::string& v2)> apply;
  absl::StatusCode code;
  std::string named;  // the file the errors name, in version 2
  std::string why;    // and what they say of it
  std::string entry;  // nn::LoadTensors of the damaged file names this entry ("": no check)
};

// A copy of `pristine` in `dir`, damaged: Reader::LoadCheckpoint of version 2 fails naming
// the damage, the directory's newest whole version is version 1, and servers started on
// it pass over version 2 naming the damage and restore version 1, which Client::Resume
// reports and Reader::Read finds.
void ExpectDetected(const Damage& damage, const std::string& pristine, const std::string& dir, const Tensor& at_v1) {
  SCOPED_TRACE(damage.what);
  fs::copy(pristine, dir, fs::copy_options::recursive);
  const std::string v1 = VersionPath(dir, 1), v2 = VersionPath(dir, 2);
  ASSERT_NO_FATAL_FAILURE(damage.apply(v1, v2));
  const std::string named = v2 + damage.named;

  absl::StatusOr<TablesSnapshot> read = Reader::LoadCheckpoint(v2, {"w"}, {kDamaged});
  EXPECT_EQ(read.status().code(), damage.code) << read.status();
  EXPECT_TRUE(Contains(read.status().message(), named)) << read.status();
  EXPECT_TRUE(Contains(read.status().message(), damage.why)) << read.status();
  if (!damage.entry.empty()) {
    absl::StatusOr<nn::NamedTensors> file = nn::LoadTensors(named);
    EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss) << file.status();
    EXPECT_TRUE(Contains(file.status().message(), absl::StrCat("'", damage.entry, "'"))) << file.status();
  }
  absl::StatusOr<TablesSnapshot> newest = Reader::LoadCheckpoint(dir, {"w"}, {kDamaged});
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->steps, std::vector<int64_t>{2}) << "the directory's newest whole version is version 1";
  EXPECT_TRUE(BitEqual(newest->values[0], at_v1));

  Deployment d = Deployment::Start(2, 1, {.checkpoint_dir = dir});
  ASSERT_NE(d.group, nullptr);
  for (size_t i = 0; i < 2; ++i) {
    const RestoredCheckpoint& r = d.servers[i]->restored();
    EXPECT_EQ(r.version, 1) << kTwoServers[i];
    EXPECT_EQ(r.step, 2) << kTwoServers[i];
    ASSERT_EQ(r.skipped.size(), 1u) << kTwoServers[i] << ": " << absl::StrJoin(r.skipped, "; ");
    EXPECT_TRUE(r.skipped[0].starts_with(v2 + ": ")) << r.skipped[0];
    EXPECT_TRUE(Contains(r.skipped[0], named)) << r.skipped[0];
    EXPECT_TRUE(Contains(r.skipped[0], damage.why)) << r.skipped[0];
  }
  Client c(d[2], kTwoServers, 0, 1);
  absl::StatusOr<ResumePoint> resume = c.Resume();
  ASSERT_TRUE(resume.ok()) << resume.status();
  EXPECT_EQ(resume->version, 1);
  EXPECT_EQ(resume->step, 2);
  absl::StatusOr<TablesSnapshot> now = Reader(d[2], kTwoServers).Read({"w"}, {kDamaged}).Get();
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_TRUE(BitEqual(now->values[0], at_v1));
  EXPECT_TRUE(d.group->ShutdownAll().ok());
}

TEST(CheckpointVersionsTest, EveryKindOfDamageIsDetectedNamedAndPassedOver) {
  const ScopedTempDir scoped("ckv_damage");
  ASSERT_TRUE(scoped.ok());
  const std::string pristine = scoped.File("pristine");
  const Tensor at_v1 = WriteTwoVersions(pristine);
  ASSERT_TRUE(at_v1.defined());
  const std::vector<Damage> damages = {
      {"a flipped bit in a value of a server's file",
       [](const std::string&, const std::string& v2) {
         const std::string f = v2 + "/worker0.gwps";
         FlipBit(f, EntryData(f, "w|values") + 4 * 2 + 1, 3);
       },
       absl::StatusCode::kDataLoss, "/worker0.gwps", "entry 'w|values' fails its checksum", "w|values"},
      {"a flipped bit in a table's step counter",
       [](const std::string&, const std::string& v2) {
         const std::string f = v2 + "/worker1.gwps";
         FlipBit(f, EntryData(f, "w|meta") + 8 * 6, 0);  // checkpoint.cc Meta kApplied: the steps applied
       },
       absl::StatusCode::kDataLoss, "/worker1.gwps", "entry 'w|meta' fails its checksum", "w|meta"},
      {"a flipped bit in the manifest's JSON",
       [](const std::string&, const std::string& v2) {
         const std::string text = ReadAll(v2 + "/MANIFEST");
         const size_t at = text.find("\"step\": 4");
         ASSERT_NE(at, std::string::npos) << text;
         FlipBit(v2 + "/MANIFEST", at + 8, 0);  // "step": 5
       },
       absl::StatusCode::kDataLoss, "/MANIFEST", "is damaged: checksum", ""},
      {"a truncated manifest",
       [](const std::string&, const std::string& v2) {
         fs::resize_file(v2 + "/MANIFEST", fs::file_size(v2 + "/MANIFEST") / 2);
       },
       absl::StatusCode::kDataLoss, "/MANIFEST", "is damaged: no checksum line", ""},
      // The manifest says the servers shared the directory: every file must be there.
      {"a missing file", [](const std::string&, const std::string& v2) { fs::remove(v2 + "/worker1.gwps"); },
       absl::StatusCode::kNotFound, "/worker1.gwps", "", ""},
  };
  int n = 0;
  for (const Damage& damage : damages) {
    ExpectDetected(damage, pristine, scoped.File(absl::StrCat("case", n++)), at_v1);
  }

  // A table that diverged (a NaN gradient pushed to an asynchronous table) is not cut: the
  // version fails naming the entry, and the servers count it.
  {
    Deployment d = Deployment::Start(2, 1, {.checkpoint_dir = scoped.File("diverged")});
    ASSERT_NE(d.group, nullptr);
    Client c(d[2], kTwoServers, 0, 1);
    ASSERT_TRUE(c.CreateDense("a", Tensor::Ones({8}), optim::Sgd{.lr = 0.5}, Consistency::kAsync).ok());
    ASSERT_TRUE(c.Push("a", 0, Tensor::Full({8}, std::numeric_limits<double>::quiet_NaN())).Get().ok());
    absl::StatusOr<CheckpointInfo> cut = c.Checkpoint().Get();
    EXPECT_EQ(cut.status().code(), absl::StatusCode::kFailedPrecondition) << cut.status();
    EXPECT_TRUE(Contains(cut.status().message(), "'a|values' holds nan at index 0")) << cut.status();
    EXPECT_TRUE(Contains(cut.status().message(), "diverged")) << cut.status();
    EXPECT_EQ(d.servers[0]->checkpoint_stats().failed + d.servers[1]->checkpoint_stats().failed, 2);
    EXPECT_TRUE(d.group->ShutdownAll().ok());
  }

  // NaN values in a version whose checksums are right (servers that allow them wrote it):
  // a NaN gradient pushed to an asynchronous table before the cut.
  const std::string nan_dir = scoped.File("nan");
  Tensor a_at_v1;
  {
    Deployment d = Deployment::Start(2, 1, {.checkpoint_dir = nan_dir, .allow_non_finite = true});
    ASSERT_NE(d.group, nullptr);
    Client c(d[2], kTwoServers, 0, 1);
    ASSERT_TRUE(c.CreateDense("a", Tensor::Ones({8}), optim::Sgd{.lr = 0.5}, Consistency::kAsync).ok());
    ASSERT_TRUE(c.Push("a", 0, Tensor::Ones({8})).Get().ok());
    ASSERT_TRUE(c.Checkpoint().Get().ok());
    a_at_v1 = *c.Pull("a", 1).Get();
    ASSERT_TRUE(c.Push("a", 1, Tensor::Full({8}, std::numeric_limits<double>::quiet_NaN())).Get().ok());
    absl::StatusOr<CheckpointInfo> v2 = c.Checkpoint().Get();
    ASSERT_TRUE(v2.ok()) << v2.status();
    ASSERT_EQ(v2->version, 2);
    EXPECT_TRUE(d.group->ShutdownAll().ok());
  }
  {
    const std::string v2 = VersionPath(nan_dir, 2);
    absl::StatusOr<Manifest> m = ReadManifest(v2);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(CheckVersion(v2, *m, CheckScope::kAll).ok()) << "the NaN version's checksums are right";
    absl::StatusOr<TablesSnapshot> read = Reader::LoadCheckpoint(v2, {"a"}, {{8}});
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
    EXPECT_TRUE(Contains(read.status().message(), "a|values")) << read.status();
  }
  {
    Deployment d = Deployment::Start(2, 1, {.checkpoint_dir = nan_dir});
    ASSERT_NE(d.group, nullptr);
    for (const auto& server : d.servers) {
      const RestoredCheckpoint& r = server->restored();
      EXPECT_EQ(r.version, 1) << "NaN values are refused";
      ASSERT_EQ(r.skipped.size(), 1u) << absl::StrJoin(r.skipped, "; ");
      EXPECT_TRUE(r.skipped[0].starts_with(VersionPath(nan_dir, 2) + ": ")) << r.skipped[0];
      EXPECT_TRUE(Contains(r.skipped[0], "a|values")) << r.skipped[0];
    }
    absl::StatusOr<TablesSnapshot> now = Reader(d[2], kTwoServers).Read({"a"}, {{8}}).Get();
    ASSERT_TRUE(now.ok()) << now.status();
    EXPECT_TRUE(BitEqual(now->values[0], a_at_v1));
    EXPECT_TRUE(d.group->ShutdownAll().ok());
  }
  {
    Deployment d = Deployment::Start(2, 1, {.checkpoint_dir = nan_dir, .allow_non_finite = true});
    ASSERT_NE(d.group, nullptr);
    for (const auto& server : d.servers) {
      EXPECT_EQ(server->restored().version, 2) << "allow_non_finite restores them";
      EXPECT_TRUE(server->restored().skipped.empty()) << absl::StrJoin(server->restored().skipped, "; ");
    }
    absl::StatusOr<TablesSnapshot> now = Reader(d[2], kTwoServers).Read({"a"}, {{8}}).Get();
    ASSERT_TRUE(now.ok()) << now.status();
    for (int64_t i = 0; i < 8; ++i) EXPECT_TRUE(std::isnan(now->values[0].data<float>()[i])) << i;
    EXPECT_TRUE(d.group->ShutdownAll().ok());
  }
}

// A whole, valid file put in place of another (mixed versions, one server's file over
// the other's) is caught by its manifest's CRC32C (checkpoint.h, nn/serialize.h: the
// digest is of the file's contents; a CRC over all its bytes, entry CRCs included, would
// depend on the entries' lengths only, and two files of one layout would pass).
TEST(CheckpointVersionsTest, AWholeValidFileInPlaceOfAnotherIsDetected) {
  const ScopedTempDir scoped("ckv_swap");
  ASSERT_TRUE(scoped.ok());
  const std::string pristine = scoped.File("pristine");
  const Tensor at_v1 = WriteTwoVersions(pristine);
  ASSERT_TRUE(at_v1.defined());
  {
    // The cause, in nn alone: two files of one layout and different contents.
    nn::FileDigest a, b;
    const Tensor x = Tensor::FromVector(std::vector<float>{1, 2, 3}, {3});
    const Tensor y = Tensor::FromVector(std::vector<float>{7, -5, 9}, {3});
    ASSERT_TRUE(nn::SaveTensors(scoped.File("a"), {{"x", x}}, &a).ok());
    ASSERT_TRUE(nn::SaveTensors(scoped.File("b"), {{"y", y}}, &b).ok());
    EXPECT_NE(a, b) << "different contents, one digest: " << a.bytes << " bytes, crc32c " << a.crc32c;
  }
  const std::vector<Damage> damages = {
      {"a file of another version",
       [](const std::string& v1, const std::string& v2) {
         fs::copy_file(v1 + "/worker1.gwps", v2 + "/worker1.gwps", fs::copy_options::overwrite_existing);
       },
       absl::StatusCode::kDataLoss, "/worker1.gwps", "damaged or from another version", ""},
      {"one server's file over the other's",
       [](const std::string&, const std::string& v2) {
         fs::copy_file(v2 + "/worker0.gwps", v2 + "/worker1.gwps", fs::copy_options::overwrite_existing);
       },
       absl::StatusCode::kDataLoss, "/worker1.gwps", "damaged or from another version", ""},
  };
  int n = 0;
  for (const Damage& damage : damages) {
    ExpectDetected(damage, pristine, scoped.File(absl::StrCat("case", n++)), at_v1);
  }
}

// ------------------------------------------------------------------------------------
// 5. A checkpoint directory on a full disk (a 256 KiB tmpfs): the cut fails naming the
//    file and the reason, the servers count it, periodic cuts stop the pushes after
//    checkpoint_max_failures in a row, and the version that fit stays whole.

TEST(CheckpointVersionsTest, AFullDiskFailsCutsNamingTheFileStopsTheJobAtTheLimitAndKeepsTheLastVersion) {
  const ScopedTempDir scoped("ckv_full");
  ASSERT_TRUE(scoped.ok());
  const std::string dir = scoped.File("ckpt");
  ASSERT_TRUE(fs::create_directory(dir));
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=256k") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs on " << dir << ": " << std::strerror(errno);
  }
  const absl::Cleanup unmount = [&] { EXPECT_EQ(::umount2(dir.c_str(), MNT_DETACH), 0) << std::strerror(errno); };
  const std::string v1 = VersionPath(dir, 1);
  const Shape small{64}, big{200000};  // big: 400 KB a server
  Tensor small_at_v1;
  {
    Deployment d = Deployment::Start(2, 2, {.checkpoint_dir = dir});
    ASSERT_NE(d.group, nullptr);
    Client x(d[3], kTwoServers, 0, 1);
    ASSERT_TRUE(x.CreateDense("small", Tensor::Ones(small), optim::Sgd{.lr = 1}, Consistency::kSync).ok());
    ASSERT_TRUE(x.Push("small", 0, Tensor::Ones(small)).Get().ok());
    absl::StatusOr<CheckpointInfo> fit = x.Checkpoint().Get();
    ASSERT_TRUE(fit.ok()) << fit.status();
    ASSERT_EQ(fit->version, 1);
    small_at_v1 = *x.Pull("small", 1).Get();

    ASSERT_TRUE(x.CreateDense("big", Tensor::Zeros(big), optim::Sgd{.lr = 1}, Consistency::kAsync).ok());
    absl::StatusOr<CheckpointInfo> full = x.Checkpoint().Get();
    EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted) << full.status();
    EXPECT_TRUE(Contains(full.status().message(), VersionPath(dir, 2) + "/worker")) << full.status();
    EXPECT_TRUE(Contains(full.status().message(), "No space left on device")) << full.status();
    // A failed cut completes once every server answered its write, which each counts
    // before answering: nothing to wait for.
    auto failed_everywhere = [&](int64_t n) {
      for (const auto& server : d.servers) {
        const CheckpointStats stats = server->checkpoint_stats();
        EXPECT_EQ(stats.failed, n);
        EXPECT_EQ(stats.failures_in_a_row, n);
        EXPECT_EQ(stats.written, 1);
        EXPECT_TRUE(Contains(stats.last_error, "No space left on device")) << stats.last_error;
      }
    };
    failed_everywhere(1);
    // Nothing of the failed version stays but its (empty) directory.
    EXPECT_EQ(Listing(dir), (std::vector<std::string>{"v00000001/", "v00000001/MANIFEST", "v00000001/worker0.gwps",
                                                      "v00000001/worker1.gwps", "v00000002/"}));

    // A trainer cutting every millisecond: its pushes fail once two cuts in a row failed.
    Client t(d[2], kTwoServers, 0, 1,
             ClientOptions{.checkpoint_every = absl::Milliseconds(1), .checkpoint_max_failures = 2});
    ASSERT_TRUE(t.CreateDense("small", Tensor::Ones(small), optim::Sgd{.lr = 1}, Consistency::kSync).ok());
    ASSERT_TRUE(t.CreateDense("big", Tensor::Zeros(big), optim::Sgd{.lr = 1}, Consistency::kAsync).ok());
    absl::Status stopped;
    int64_t s = 1;
    for (const absl::Time deadline = absl::Now() + absl::Seconds(10); stopped.ok() && absl::Now() < deadline; ++s) {
      stopped = t.Push("small", s, Tensor::Ones(small)).Get().status();
    }
    EXPECT_EQ(stopped.code(), absl::StatusCode::kResourceExhausted) << stopped;
    EXPECT_TRUE(Contains(stopped.message(), "2 checkpoints in a row failed (the job stops after 2")) << stopped;
    EXPECT_TRUE(Contains(stopped.message(), "No space left on device")) << stopped;
    failed_everywhere(3);
    EXPECT_EQ(Listing(dir), (std::vector<std::string>{"v00000001/", "v00000001/MANIFEST", "v00000001/worker0.gwps",
                                                      "v00000001/worker1.gwps", "v00000002/", "v00000003/",
                                                      "v00000004/"}));
    EXPECT_TRUE(d.group->ShutdownAll().ok());
  }
  // The version that fit is whole, loads and is restored; the next cut that succeeds
  // removes the failed ones.
  absl::StatusOr<Manifest> m = ReadManifest(v1);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(CheckVersion(v1, *m, CheckScope::kAll).ok());
  absl::StatusOr<TablesSnapshot> loaded = Reader::LoadCheckpoint(dir, {"small"}, {small});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(BitEqual(loaded->values[0], small_at_v1));
  Deployment d = Deployment::Start(2, 1, {.checkpoint_dir = dir});
  ASSERT_NE(d.group, nullptr);
  for (const auto& server : d.servers) {
    const RestoredCheckpoint& r = server->restored();
    EXPECT_EQ(r.version, 1);
    EXPECT_EQ(r.step, 1);
    EXPECT_EQ(r.skipped.size(), 3u) << "versions 4, 3, 2 have no manifest: " << absl::StrJoin(r.skipped, "; ");
  }
  Client x(d[2], kTwoServers, 0, 1);
  ASSERT_TRUE(x.CreateDense("small", Tensor::Ones(small), optim::Sgd{.lr = 1}, Consistency::kSync).ok());
  absl::StatusOr<ResumePoint> resume = x.Resume();
  ASSERT_TRUE(resume.ok()) << resume.status();
  EXPECT_EQ(resume->step, 1);
  absl::StatusOr<Tensor> restored = x.Pull("small", 1).Get();
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(BitEqual(*restored, small_at_v1));
  ASSERT_TRUE(x.Push("small", 1, Tensor::Ones(small)).Get().ok());
  absl::StatusOr<CheckpointInfo> next = x.Checkpoint().Get();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->version, 5);
  EXPECT_EQ(Listing(dir), (std::vector<std::string>{"v00000001/", "v00000001/MANIFEST", "v00000001/worker0.gwps",
                                                    "v00000001/worker1.gwps", "v00000005/", "v00000005/MANIFEST",
                                                    "v00000005/worker0.gwps", "v00000005/worker1.gwps"}));
  EXPECT_TRUE(d.group->ShutdownAll().ok());
}

}  // namespace
}  // namespace gw::param_server

namespace gw::param_server {
namespace {

// A client that does not push (an operator's) cuts while two trainers run synchronous
// steps as fast as they can: each cut is planned further ahead when the trainers passed
// the step it aimed at, so every one completes, each one step of the table.
TEST(CheckpointVersionsTest, ACutFromAClientThatDoesNotPushCompletesWhileTrainersRunAtFullSpeed) {
  const ScopedTempDir scoped("ckv_operator");
  ASSERT_TRUE(scoped.ok());
  Deployment d = Deployment::Start(2, 3, {.checkpoint_dir = scoped.path(), .checkpoint_keep = 10});
  ASSERT_NE(d.group, nullptr);
  Client t0(d[2], kTwoServers, 0, 2), t1(d[3], kTwoServers, 1, 2), op(d[4], kTwoServers, -1, 2);
  for (Client* c : {&t0, &t1, &op}) {
    ASSERT_TRUE(c->CreateDense("w", Tensor::Zeros({64}), optim::Sgd{.lr = 0.01}, Consistency::kSync).ok());
  }
  // Both trainers stop at one step (a synchronous step waits for both): a few past where
  // trainer 0 is when the cuts are done.
  std::atomic<int64_t> done{0}, stop_at{std::numeric_limits<int64_t>::max()};
  auto train = [&](Client& c) {
    for (int64_t step = 0; step < stop_at.load(); ++step) {
      if (!c.PushPull("w", step, Tensor::Ones({64})).Get().ok()) return;
      if (c.trainer() == 0) done = step + 1;
    }
  };
  int64_t last_step = -1;
  {
    std::thread a([&] { train(t0); }), b([&] { train(t1); });
    for (int i = 0; i < 8; ++i) {
      absl::StatusOr<CheckpointInfo> cut = op.Checkpoint().Get();
      EXPECT_TRUE(cut.ok()) << "cut " << i << ": " << cut.status();
      if (!cut.ok()) break;
      EXPECT_GT(cut->step, last_step);
      last_step = cut->step;
    }
    stop_at = done.load() + 3;
    a.join();
    b.join();
  }
  EXPECT_GT(last_step, 0);
  EXPECT_TRUE(d.group->ShutdownAll().ok());
}

}  // namespace
}  // namespace gw::param_server
