// Vector clocks: the happens-before order of the simulator's streams and host.
//
// Every agent that issues work (the host, each stream) is a component. Each
// operation is stamped with the clock of its agent after a tick; operation `a`
// happens before an operation whose clock is `c` iff a.time <= c[a.component].
// Events carry clocks between agents (Record copies, Wait joins), and the host
// joins the clock of whatever it synchronized with.

#ifndef OFFLOAD_BACKENDS_SIM_VECTOR_CLOCK_H_
#define OFFLOAD_BACKENDS_SIM_VECTOR_CLOCK_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace offload {

// The component and time of one operation.
struct Epoch {
  size_t component = 0;
  uint64_t time = 0;
};

class VectorClock {
 public:
  uint64_t Get(size_t component) const {
    return component < times_.size() ? times_[component] : 0;
  }

  // Advances `component` by one and returns the operation's epoch.
  Epoch Tick(size_t component) {
    Grow(component);
    return Epoch{component, ++times_[component]};
  }

  // Pointwise maximum: afterwards *this knows everything `other` knows.
  void Join(const VectorClock& other) {
    if (other.times_.size() > times_.size()) times_.resize(other.times_.size());
    for (size_t i = 0; i < other.times_.size(); ++i) {
      times_[i] = std::max(times_[i], other.times_[i]);
    }
  }

  // Whether the operation stamped `epoch` happens before one whose clock is
  // *this.
  bool Covers(const Epoch& epoch) const { return epoch.time <= Get(epoch.component); }

 private:
  void Grow(size_t component) {
    if (component >= times_.size()) times_.resize(component + 1, 0);
  }

  std::vector<uint64_t> times_;
};

}  // namespace offload

#endif  // OFFLOAD_BACKENDS_SIM_VECTOR_CLOCK_H_
