#include "gradwire/serve/follower.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gw::serve {

std::string FollowStatus::ToString() const {
  if (served_step < 0) {
    return absl::StrCat("no version yet (", failures, " failed refreshes",
                        last_error.ok() ? "" : absl::StrCat(", last: ", last_error.message()), ")");
  }
  return absl::StrFormat("serving %s, %d updates behind, %.1f s old, %d refreshes, %d failed%s", version,
                         steps_behind, absl::ToDoubleSeconds(age), refreshes, failures,
                         last_error.ok() ? "" : absl::StrCat(" (last: ", last_error.message(), ")"));
}

absl::StatusOr<Follower::Tables> Follower::Find(const Serving& serving, const std::string& model,
                                                const std::map<std::string, std::string>& tables) {
  absl::StatusOr<std::vector<std::pair<std::string, Shape>>> shapes = serving.ParameterShapes(model);
  if (!shapes.ok()) return shapes.status();
  Tables out;
  for (const auto& [name, shape] : *shapes) {
    auto it = tables.find(name);
    out.parameters.push_back(name);
    out.tables.push_back(it == tables.end() ? name : it->second);
    out.shapes.push_back(shape);
  }
  for (const auto& [name, table] : tables) {
    if (std::find(out.parameters.begin(), out.parameters.end(), name) == out.parameters.end()) {
      return absl::InvalidArgumentError(absl::StrCat("model '", model, "' has no parameter '", name,
                                                     "' (mapped to table '", table, "')"));
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Follower>> Follower::Start(std::shared_ptr<Serving> serving, std::string model,
                                                          FollowOptions options) {
  if (options.servers.empty()) return absl::InvalidArgumentError("FollowOptions::servers names no parameter server");
  if (options.every < absl::ZeroDuration() || options.every_steps < 0 || options.attempts < 1 ||
      (options.every_steps > 0 && options.poll <= absl::ZeroDuration())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "following '", model, "': every and every_steps must not be negative, attempts at least 1, and poll positive"));
  }
  absl::StatusOr<Tables> tables = Find(*serving, model, options.tables);
  if (!tables.ok()) return tables.status();
  std::unique_ptr<Follower> follower(
      new Follower(std::move(serving), std::move(model), std::move(options), *std::move(tables)));
  follower->thread_ = std::thread([f = follower.get()] { f->Run(); });
  return follower;
}

Follower::Follower(std::shared_ptr<Serving> serving, std::string model, FollowOptions options, Tables tables)
    : serving_(std::move(serving)),
      model_(std::move(model)),
      options_(std::move(options)),
      tables_(std::move(tables)),
      reader_(serving_->agent(), options_.servers, options_.timeout) {
  statistics_ = serving_->agent().statistics().Add("follow", [this](std::vector<rpc::Sample>& out) {
    const FollowStatus s = Status();
    auto add = [&](const char* name, double value) {
      out.push_back({absl::StrCat("gradwire_serve_follow_", name), {{"model", model_}}, value});
    };
    add("served_step", static_cast<double>(s.served_step));
    add("steps_behind", static_cast<double>(s.steps_behind));
    add("age_seconds", absl::ToDoubleSeconds(s.age));
    add("refreshes_total", static_cast<double>(s.refreshes));
    add("failures_total", static_cast<double>(s.failures));
  });
}

Follower::~Follower() { Stop(); }

void Follower::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Follower::Run() {
  const bool scheduled = options_.every > absl::ZeroDuration() || options_.every_steps > 0;
  const absl::Duration period = options_.every_steps > 0 ? options_.poll : options_.every;
  for (bool first = true;; first = false) {
    if (!first) {
      absl::MutexLock lock(&mu_);
      if (!scheduled) {
        mu_.Await(absl::Condition(&stopping_));
      } else {
        mu_.AwaitWithTimeout(absl::Condition(&stopping_), period);
      }
      if (stopping_) return;
    }
    if (options_.every_steps > 0 && !first) {
      absl::StatusOr<int64_t> latest = LatestStep();
      if (!latest.ok()) continue;
      int64_t served;
      {
        absl::MutexLock lock(&mu_);
        served = status_.served_step;
      }
      if (served >= 0 && *latest >= served && *latest < served + options_.every_steps) continue;
    }
    Refresh().IgnoreError();  // recorded in the status
  }
}

absl::Status Follower::Failed(absl::Status s) {
  s = absl::Status(s.code(), absl::StrCat("following '", model_, "' on ", serving_->agent().self().name,
                                          " (it keeps serving its current version): ", s.message()));
  absl::MutexLock lock(&mu_);
  ++status_.failures;
  status_.last_error = s;
  return s;
}

absl::StatusOr<int64_t> Follower::LatestStep() {
  absl::StatusOr<param_server::TablesSnapshot> steps = reader_.Steps(tables_.tables).Get();
  if (!steps.ok()) return Failed(steps.status());
  absl::MutexLock lock(&mu_);
  status_.latest_step = steps->oldest;
  return steps->oldest;
}

absl::Status Follower::Refresh() {
  absl::MutexLock one_at_a_time(&refresh_mu_);
  absl::StatusOr<int64_t> latest = LatestStep();
  if (!latest.ok()) return latest.status();
  {
    absl::MutexLock lock(&mu_);
    if (status_.served_step == *latest) return absl::OkStatus();  // nothing new
  }
  absl::StatusOr<param_server::TablesSnapshot> read;
  absl::Time read_at;
  for (int attempt = 0; attempt < options_.attempts; ++attempt) {
    read_at = absl::Now();
    read = reader_.Read(tables_.tables, tables_.shapes).Get();
    if (!read.ok()) return Failed(read.status());
    if (read->consistent()) break;
  }
  if (options_.one_step && !read->consistent()) {
    return Failed(absl::AbortedError(absl::StrCat("the tables moved on during ", options_.attempts,
                                                  " reads (their shards were at steps ", read->oldest, " to ",
                                                  read->newest, "); the next refresh tries again")));
  }
  nn::NamedTensors state;
  for (size_t i = 0; i < tables_.parameters.size(); ++i) state.emplace_back(tables_.parameters[i], read->values[i]);
  std::string version = absl::StrCat("step-", read->oldest);
  if (absl::Status s = serving_->LoadParameters(model_, state, version); !s.ok()) return Failed(s);
  absl::MutexLock lock(&mu_);
  status_.version = std::move(version);
  status_.served_step = read->oldest;
  status_.latest_step = read->newest;
  served_read_at_ = read_at;
  ++status_.refreshes;
  return absl::OkStatus();
}

FollowStatus Follower::Status() const {
  absl::MutexLock lock(&mu_);
  return StatusLocked();
}

bool Follower::AwaitStatus(const std::function<bool(const FollowStatus&)>& until, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto holds = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return until(StatusLocked()); };
  return mu_.AwaitWithDeadline(absl::Condition(&holds), deadline);
}

FollowStatus Follower::StatusLocked() const {
  FollowStatus s = status_;
  if (s.served_step >= 0) {
    s.steps_behind = s.latest_step - s.served_step;
    s.age = absl::Now() - served_read_at_;
  }
  return s;
}

absl::Status ServeCheckpoint(Serving& serving, const std::string& model, const std::string& checkpoint,
                             std::string version, const std::map<std::string, std::string>& tables) {
  absl::StatusOr<Follower::Tables> found = Follower::Find(serving, model, tables);
  if (!found.ok()) return found.status();
  absl::StatusOr<param_server::TablesSnapshot> read =
      param_server::Reader::LoadCheckpoint(checkpoint, found->tables, found->shapes);
  if (!read.ok()) {
    return absl::Status(read.status().code(), absl::StrCat("serving '", model, "' from a parameter-server checkpoint (",
                                                           serving.agent().self().name,
                                                           " keeps its current version): ", read.status().message()));
  }
  nn::NamedTensors state;
  for (size_t i = 0; i < found->parameters.size(); ++i) state.emplace_back(found->parameters[i], read->values[i]);
  return serving.LoadParameters(model, state, std::move(version));
}

}  // namespace gw::serve
