// Ctrl-C during a long native call. Python runs its SIGINT handler only once control is back in the
// interpreter, so for the call's duration a C handler sets a flag that the pass polls between layers
// (RunControl::interrupt); the pass then throws Interrupted, which the module raises as
// KeyboardInterrupt. A Ctrl-C that lands after the last poll is handed back to Python on return.
#pragma once
#include <pybind11/pybind11.h>

#include <atomic>
#include <csignal>

#include "core/error.h"

namespace strata {

class SigintScope {
 public:
  // Made and destroyed with the GIL held. `catch_sigint`: the caller is on Python's main thread and
  // Python's SIGINT handler is its default one (else the scope does nothing and flag() is null).
  explicit SigintScope(bool catch_sigint);
  ~SigintScope();
  SigintScope(const SigintScope&) = delete;
  SigintScope& operator=(const SigintScope&) = delete;
  // Set when Ctrl-C was pressed during the scope; null when the scope does not catch it.
  const std::atomic<bool>* flag() const;
  // The interrupt reached Python as Interrupted: nothing to hand back on return.
  void delivered() { delivered_ = true; }

 private:
  bool catching_ = false, installed_ = false, delivered_ = false;
  struct sigaction old_{};
};

// fn(flag) with the GIL released, Ctrl-C caught as above.
template <class F>
auto interruptible(bool catch_sigint, F&& fn) {
  SigintScope scope(catch_sigint);
  try {
    pybind11::gil_scoped_release nogil;
    return fn(scope.flag());
  } catch (const Interrupted&) {
    scope.delivered();
    throw;
  }
}

}  // namespace strata
