// GradMode / NoGradGuard: whether operations on this thread record autograd history.
//
// Contract
//   - Thread-local, on by default. NoGradGuard turns recording off for its scope and
//     restores the previous mode on destruction (scopes nest).
//   - Optimizers and parameter servers update parameters under NoGradGuard.
#ifndef GRADWIRE_AUTOGRAD_GRAD_MODE_H_
#define GRADWIRE_AUTOGRAD_GRAD_MODE_H_

namespace gw::autograd {

class GradMode {
 public:
  static bool IsEnabled();
  static void SetEnabled(bool enabled);
};

class NoGradGuard {
 public:
  NoGradGuard() : previous_(GradMode::IsEnabled()) { GradMode::SetEnabled(false); }
  ~NoGradGuard() { GradMode::SetEnabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace gw::autograd

#endif  // GRADWIRE_AUTOGRAD_GRAD_MODE_H_
