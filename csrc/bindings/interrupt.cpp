// The SIGINT handler of SigintScope: it sets one flag, the only thing a signal handler may safely do.
#include "bindings/interrupt.h"

namespace strata {

namespace {
// A signal handler reaches static storage only. Scopes nest (a progress callback may call into the
// model again); the outermost one installs the handler and restores Python's. Both under the GIL.
std::atomic<bool> g_sigint{false};
int g_depth = 0;

extern "C" void on_sigint(int) { g_sigint.store(true, std::memory_order_relaxed); }
}  // namespace

SigintScope::SigintScope(bool catch_sigint) : catching_(catch_sigint) {
  if (!catching_) return;
  if (g_depth++ > 0) return;
  g_sigint.store(false);
  struct sigaction sa{};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  installed_ = sigaction(SIGINT, &sa, &old_) == 0;
}

SigintScope::~SigintScope() {
  if (!catching_) return;
  --g_depth;
  if (!installed_) return;
  sigaction(SIGINT, &old_, nullptr);
  // Python's handler raises KeyboardInterrupt at its next check, as if the signal came now.
  if (g_sigint.exchange(false) && !delivered_) PyErr_SetInterrupt();
}

const std::atomic<bool>* SigintScope::flag() const { return catching_ ? &g_sigint : nullptr; }

}  // namespace strata
