// SimBackend's handles: Stream and Event (thin forwarders into the
// SimBackend), Graph and GraphExec (what a capture recorded, see
// sim_graph.cc). Private to backends/sim (sim_backend.cc, sim_graph.cc,
// sim_graph_launch.cc).

#ifndef OFFLOAD_BACKENDS_SIM_SIM_HANDLES_H_
#define OFFLOAD_BACKENDS_SIM_SIM_HANDLES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "backends/sim/vector_clock.h"
#include "engine/backend.h"
#include "engine/status.h"

namespace offload {

class SimBackend::SimEvent final : public Event {
 public:
  SimEvent(SimBackend* sim, uint64_t id) : sim_(sim), id_(id) {}

  StatusOr<bool> Query() override {
    OFFLOAD_RETURN_IF_ERROR(sim_->CheckEventRan(*this, "Query"));
    bool done = sim_->EventDone(*this);
    if (done) sim_->host_clock_.Join(clock_);  // the host has observed it
    return done;
  }

  Status Synchronize() override {
    OFFLOAD_RETURN_IF_ERROR(sim_->CheckEventRan(*this, "Synchronize"));
    sim_->SynchronizeEvent(*this);
    return OkStatus();
  }

  std::string Name() const { return "event#" + std::to_string(id_); }

  SimBackend* sim_;
  uint64_t id_;
  // The last eager record (ignored while captured_by_ is set).
  bool recorded_ = false;
  int stream_ = -1;     // where it was last recorded
  uint64_t count_ = 0;  // done once that stream completed this many ops
  VectorClock clock_;   // what the recording stream knew
  // Set when the last record was made on a capturing stream: the capture's
  // id, the recording stream, and the captured work it orders after (see
  // CaptureState::known).
  uint64_t captured_by_ = 0;
  int capture_stream_ = -1;
  std::vector<int64_t> capture_known_;
};

class SimBackend::SimStream final : public Stream {
 public:
  SimStream(SimBackend* sim, int index, std::string name)
      : sim_(sim), index_(index), name_(std::move(name)) {}

  std::string_view name() const override { return name_; }

  Status Copy(void* dst, const void* src, int64_t bytes) override {
    return sim_->EnqueueCopy(index_, dst, src, bytes);
  }

  Status Gather(void* dst, const void* src, int64_t element_size,
                const std::vector<int64_t>& shape,
                const std::vector<int64_t>& strides) override {
    return sim_->EnqueueGather(index_, dst, src, element_size, shape, strides);
  }

  Status Record(Event& event) override {
    auto* sim_event = dynamic_cast<SimEvent*>(&event);
    if (sim_event == nullptr || sim_event->sim_ != sim_) {
      return InvalidArgumentError("Record on stream '" + name_ +
                                  "': the event belongs to another backend");
    }
    return sim_->RecordEvent(index_, *sim_event);
  }

  Status Wait(const Event& event) override {
    auto* sim_event = dynamic_cast<const SimEvent*>(&event);
    if (sim_event == nullptr || sim_event->sim_ != sim_) {
      return InvalidArgumentError("Wait on stream '" + name_ +
                                  "': the event belongs to another backend");
    }
    return sim_->WaitEvent(index_, *sim_event);
  }

  Status Synchronize() override { return sim_->SynchronizeStream(index_); }

  SimBackend* sim_;
  int index_;
  std::string name_;
};

class SimBackend::SimGraph final : public Graph {
 public:
  SimGraph(SimBackend* sim, std::shared_ptr<const GraphData> data)
      : sim_(sim), data_(std::move(data)) {}
  int64_t size() const override {
    return static_cast<int64_t>(data_->calls.size());
  }

  SimBackend* sim_;
  std::shared_ptr<const GraphData> data_;
};

class SimBackend::SimGraphExec final : public GraphExec {
 public:
  SimGraphExec(SimBackend* sim, std::shared_ptr<const GraphData> data)
      : sim_(sim), data_(std::move(data)) {}

  SimBackend* sim_;
  std::shared_ptr<const GraphData> data_;
  std::vector<int> streams_;  // replay stream by slot; [0]: the launch's
  std::vector<std::unique_ptr<SimEvent>> events_;  // by event index
  int64_t launches_ = 0;
};

}  // namespace offload

#endif  // OFFLOAD_BACKENDS_SIM_SIM_HANDLES_H_
