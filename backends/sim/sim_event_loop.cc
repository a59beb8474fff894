// SimBackend, part 3 of 5: the event loop that runs stream work in
// virtual-time order, duration jitter from the seeded RNG, and the trace.

#include "backends/sim/sim_backend.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>

namespace offload {

void SimBackend::RunUntil(const std::function<bool()>& done,
                          int64_t deadline_ns) {
  for (;;) {
    StartReadyWork();
    if (done()) return;
    // Every wait refers to work enqueued before it, so something is always
    // running while work remains; an empty set means nothing is left.
    if (running_.empty()) break;
    if (deadline_ns >= 0 && running_.top().end_ns > deadline_ns) break;
    CompleteNext();
  }
  if (deadline_ns > now_ns_) now_ns_ = deadline_ns;
}

void SimBackend::StartReadyWork() {
  bool progress = true;
  while (progress) {
    progress = false;
    // The operation waiting longest for each copy engine.
    int candidate[2] = {-1, -1};
    for (int s = 0; s < static_cast<int>(streams_.size()); ++s) {
      StreamState& st = streams_[s];
      while (!st.queue.empty() && !st.queue.front().running) {
        Op& op = st.queue.front();
        if (op.wait_stream >= 0 &&
            streams_[op.wait_stream].completed < op.wait_count) {
          break;
        }
        if (op.ready_ns < 0) op.ready_ns = now_ns_;
        if (op.engine == Engine::kNone) {
          if (op.duration_ns > 0) {
            Start(s, op);
            break;
          }
          Trace(SimPhase::kStart, op.seq, s, op.desc);
          if (op.on_start) op.on_start();
          Finish(s);  // zero duration: done at once
          progress = true;
          continue;
        }
        int e = static_cast<int>(op.engine);
        if (!engine_busy_[e]) {
          const Op* best = candidate[e] < 0
                               ? nullptr
                               : &streams_[candidate[e]].queue.front();
          if (best == nullptr || op.ready_ns < best->ready_ns ||
              (op.ready_ns == best->ready_ns && op.seq < best->seq)) {
            candidate[e] = s;
          }
        }
        break;
      }
    }
    for (int e = 0; e < 2; ++e) {
      if (candidate[e] < 0) continue;
      engine_busy_[e] = true;
      Start(candidate[e], streams_[candidate[e]].queue.front());
      progress = true;
    }
  }
}

void SimBackend::Start(int s, Op& op) {
  op.running = true;
  if (op.on_start) op.on_start();
  Trace(SimPhase::kStart, op.seq, s, op.desc);
  running_.push(Running{now_ns_ + op.duration_ns, op.seq, s});
}

void SimBackend::CompleteNext() {
  Running next = running_.top();
  running_.pop();
  now_ns_ = next.end_ns;
  Op& op = streams_[next.stream].queue.front();
  if (op.engine != Engine::kNone) {
    engine_busy_[static_cast<int>(op.engine)] = false;
  }
  Finish(next.stream);
}

void SimBackend::Finish(int s) {
  StreamState& st = streams_[s];
  Op op = std::move(st.queue.front());
  st.queue.pop_front();
  if (op.on_end) op.on_end();
  ++st.completed;
  Trace(SimPhase::kEnd, op.seq, s, op.desc);
}

int64_t SimBackend::Jitter(int64_t duration_ns) {
  if (options_.duration_jitter <= 0.0 || duration_ns == 0) return duration_ns;
  // A uniform double in [0, 1) from the top 53 bits.
  double u = static_cast<double>(NextRandom() >> 11) * 0x1.0p-53;
  double scale = 1.0 + options_.duration_jitter * (2.0 * u - 1.0);
  return std::max<int64_t>(
      0, std::llround(static_cast<double>(duration_ns) * scale));
}

uint64_t SimBackend::NextRandom() {
  // SplitMix64: small, fast, and the same on every platform.
  uint64_t z = (rng_state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void SimBackend::Trace(SimPhase phase, uint64_t seq, int s,
                       const SimTraceEntry& desc) {
  if (!options_.record_trace) return;
  SimTraceEntry& entry = trace_.emplace_back(desc);
  entry.time_ns = now_ns_;
  entry.phase = phase;
  entry.seq = seq;
  entry.stream = s;
  entry.stream_name = s < 0 ? "host" : streams_[s].name;
}

std::string SimBackend::TraceText() const {
  std::string out;
  for (const SimTraceEntry& entry : trace_) {
    out += entry.ToString();
    out += '\n';
  }
  return out;
}

}  // namespace offload
