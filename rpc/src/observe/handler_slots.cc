#include "observe/handler_slots.h"

#include <pthread.h>

#include "absl/strings/str_cat.h"
#include "observe/per_thread.h"

namespace gw::rpc::internal {

HandlerSlots::HandlerSlots() : uid_(NextOwnerId()) {}
HandlerSlots::~HandlerSlots() = default;

HandlerSlots::Slot& HandlerSlots::OfThisThread() {
  return *PerThread<Slot>(uid_, [this] {
    auto slot = std::make_unique<Slot>();
    char name[32] = {};
    if (pthread_getname_np(pthread_self(), name, sizeof(name)) == 0) slot->thread = name;
    absl::MutexLock lock(&mu_);
    if (slot->thread.empty()) slot->thread = absl::StrCat("thread ", slots_.size() + 1);
    return slots_.emplace_back(std::move(slot)).get();
  });
}

HandlerSlots::Running::Running(HandlerSlots& slots, const std::string& function, int caller)
    : slot_(&slots.OfThisThread()) {
  if (slot_->depth.load(std::memory_order_relaxed) > 0) {  // inside another handler: it is the one shown
    slot_->depth.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  absl::MutexLock lock(&slot_->mu);
  slot_->function = function;
  slot_->caller = caller;
  slot_->since = std::chrono::steady_clock::now();
  slot_->depth.store(1, std::memory_order_release);
}

// A reader may still report a run that has just ended: the record is a moment old.
HandlerSlots::Running::~Running() { slot_->depth.fetch_sub(1, std::memory_order_release); }

void HandlerSlots::AppendWaits(std::vector<Wait>& out, const std::function<std::string(int rank)>& name_of) const {
  const auto now = std::chrono::steady_clock::now();
  absl::MutexLock lock(&mu_);
  for (const auto& slot : slots_) {
    absl::MutexLock slot_lock(&slot->mu);
    if (slot->depth.load(std::memory_order_acquire) == 0) continue;
    out.push_back(
        {.layer = "handler",
         .state = "runs",
         .what = absl::StrCat("'", slot->function, "' for ", slot->caller >= 0 ? name_of(slot->caller) : "itself"),
         .seconds = std::chrono::duration<double>(now - slot->since).count(),
         .note = absl::StrCat("thread ", slot->thread)});
  }
}

}  // namespace gw::rpc::internal
