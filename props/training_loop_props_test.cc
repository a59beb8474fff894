// SPEC §6 over SPEC §7's life cycle: random programs of forwards, abandoned
// forwards, dropped graphs, detached parts and backward passes (retained or
// not, over one graph or several, reaching down to any layer) driven into a
// TrainingLoop (engine/training_loop.h) like autograd (testing/
// loop_test_util.h) on the simulated GPU.
//
// A model of the program says which graphs may be traversed: a graph whose
// forward ended (it ran all n layers, a new forward began, or its backward
// began) without being abandoned (AbandonForward, or its graph freed in the
// middle of the forward) and that no earlier pass traversed without
// retain_graph. Every such traversal gets every saved tensor back
// bit-identical (the harness checks the bytes); no hazard; the pool holds
// at most one Offloader more than graphs were ever alive at once; and once
// every graph is gone, the device holds what it held before the program, no
// host copy is left (beyond retained pinned buffers) and no iteration is
// live.
//
// The byte-budget variant (SPEC §4.7 with §7.3) runs the same programs, and
// train steps (a whole forward, a whole backward pass) among them, under an
// activation_budget_bytes between a quarter of and all the bytes a forward
// saves, with keep_host_copies, sometimes smallest_budget: the first
// iteration of each pooled Offloader records, later ones follow its plan, a
// diverged one records again. A PassEnded may then refuse a budget no plan
// can keep, only where it made a plan, naming the smallest budget that fits
// and planning with it; every other call is OK, every plan made keeps its
// peak within its budget, and the rest holds as above.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backends/sim/sim_backend.h"
#include "engine/offload.h"
#include "engine/offload_options.h"
#include "engine/status.h"
#include "engine/training_loop.h"
#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "testing/loop_test_util.h"

namespace offload {
namespace {

using loop_test::LoopGraph;
using loop_test::LoopHarness;

constexpr int kMaxLiveGraphs = 3;
// What LoopHarness saves per tensor: 4096 f32 elements.
constexpr int64_t kTensorBytes = 4096 * 4;

struct Config {
  int layers = 4;         // n, 3..5
  int offloaded = 1;      // k, 0..n-1
  int per_layer = 2;      // tensors saved per layer, 1..3
  bool retain_pinned = false;
  uint64_t sim_seed = 0;
  double gbps = 55.0;
  bool jitter = false;
  int teardown = 0;       // how the program ends (see Teardown)
  // The byte-budget variant: activation_budget_bytes of this many
  // thousandths of what a whole forward saves (250..1000).
  bool budget = false;
  int budget_permille = 1000;
  bool smallest_budget = false;

  int64_t SavedBytes() const {
    return int64_t{per_layer} * layers * kTensorBytes;
  }
  int64_t BudgetBytes() const { return SavedBytes() * budget_permille / 1000; }
};

// One step of a program. The raw numbers are read against the model's state
// when the step runs (which graph, how many layers, ...): any sequence is a
// valid program, and RapidCheck shrinks it freely.
struct Op {
  enum Kind {
    kForward,        // a new graph of `count` layers (full or partial)
    kAbandon,        // AbandonForward right after a forward (an exception)
    kStrayAbandon,   // AbandonForward with no forward running: a no-op
    kDrop,           // a graph freed
    kDropBelow,      // a graph's layers below some layer freed (detached)
    kBackward,       // one pass over some traversable graphs, then PassEnded
    kStep,           // budget variant: a train step (a whole forward, then a
                     // pass down to layer 0 over it; freed unless retained)
  };
  Kind kind = kForward;
  int pick = 0;     // which graph(s)
  int count = 0;    // layers of a forward
  int lowest0 = 0, lowest1 = 0, lowest2 = 0;  // per graph of a pass
  int order = 0;    // a pass's interleaving of layers over its graphs
  bool flag = false;   // forward: pre-hook ids; backward, step: retain_graph
  bool flag2 = false;  // forward: end a dropped running forward explicitly;
                       // step: pre-hook ids
};

void showValue(const Config& c, std::ostream& os) {
  os << "n=" << c.layers;
  if (!c.budget) os << " k=" << c.offloaded;  // a budget ignores k
  os << " tensors/layer=" << c.per_layer
     << (c.retain_pinned ? " retain_pinned_buffers" : "") << " sim_seed="
     << c.sim_seed << " gbps=" << c.gbps << (c.jitter ? " jitter" : "")
     << " teardown=" << c.teardown;
  if (c.budget) {
    os << " budget=" << c.BudgetBytes() << " (" << c.budget_permille
       << "/1000 of " << c.SavedBytes() << ")"
       << (c.smallest_budget ? " smallest_budget" : "");
  }
}

void showValue(const Op& op, std::ostream& os) {
  static const char* const kNames[] = {"Forward",   "Abandon",  "StrayAbandon",
                                       "Drop",      "DropBelow", "Backward",
                                       "Step"};
  os << kNames[op.kind] << "{pick=" << op.pick << " count=" << op.count
     << " lowest=" << op.lowest0 << "/" << op.lowest1 << "/" << op.lowest2
     << " order=" << op.order << " flag=" << op.flag << " flag2=" << op.flag2
     << "}";
}

// Sized at the most: the numbers are read modulo the model's state, and
// small sizes would mostly pick the first graph and one layer. The budget
// variant adds train steps, so that many programs run whole iterations
// after the recorded one (a plan is made and followed).
rc::Gen<Op> GenOp(bool budget) {
  auto kinds =
      budget ? rc::gen::weightedElement<Op::Kind>({{4, Op::kForward},
                                                   {2, Op::kAbandon},
                                                   {1, Op::kStrayAbandon},
                                                   {3, Op::kDrop},
                                                   {2, Op::kDropBelow},
                                                   {4, Op::kBackward},
                                                   {7, Op::kStep}})
             : rc::gen::weightedElement<Op::Kind>({{6, Op::kForward},
                                                   {2, Op::kAbandon},
                                                   {1, Op::kStrayAbandon},
                                                   {3, Op::kDrop},
                                                   {2, Op::kDropBelow},
                                                   {5, Op::kBackward}});
  return rc::gen::resize(100, rc::gen::build<Op>(
      rc::gen::set(&Op::kind, std::move(kinds)),
      rc::gen::set(&Op::pick, rc::gen::inRange(0, 64)),
      rc::gen::set(&Op::count, rc::gen::inRange(0, 64)),
      rc::gen::set(&Op::lowest0, rc::gen::inRange(0, 64)),
      rc::gen::set(&Op::lowest1, rc::gen::inRange(0, 64)),
      rc::gen::set(&Op::lowest2, rc::gen::inRange(0, 64)),
      rc::gen::set(&Op::order, rc::gen::inRange(0, 1 << 20)),
      rc::gen::set(&Op::flag), rc::gen::set(&Op::flag2)));
}

rc::Gen<Config> GenConfig(bool budget) {
  auto of_layers = [budget](int layers) {
    return rc::gen::build<Config>(
        rc::gen::set(&Config::layers, rc::gen::just(layers)),
        rc::gen::set(&Config::offloaded, rc::gen::inRange(0, layers)),
        rc::gen::set(&Config::per_layer, rc::gen::inRange(1, 4)),
        rc::gen::set(&Config::retain_pinned,
                     rc::gen::weightedElement<bool>({{3, false}, {1, true}})),
        rc::gen::set(&Config::sim_seed, rc::gen::inRange<uint64_t>(0, 1000)),
        rc::gen::set(&Config::gbps, rc::gen::element(5.0, 55.0, 500.0)),
        rc::gen::set(&Config::jitter),
        rc::gen::set(&Config::teardown, rc::gen::inRange(0, 64)),
        rc::gen::set(&Config::budget, rc::gen::just(budget)),
        rc::gen::set(&Config::budget_permille,
                     budget ? rc::gen::inRange(250, 1001)
                            : rc::gen::just(1000)),
        rc::gen::set(&Config::smallest_budget,
                     budget ? rc::gen::weightedElement<bool>(
                                  {{2, false}, {1, true}})
                            : rc::gen::just(false)));
  };
  return rc::gen::resize(100,
                         rc::gen::mapcat(rc::gen::inRange(3, 6), of_layers));
}

// A graph the program holds, and what the model knows of it.
struct ModelGraph {
  int id = 0;      // the program's forward number, for the log
  LoopGraph graph;
  int layers = 0;  // layers its forward ran (ids 0..layers-1)
  int dropped_below = 0;
  bool traversable = true;
  int traversals = 0;
  std::string why_not;  // when not traversable
};

class Program {
 public:
  explicit Program(const Config& config) : config_(config) {}

  void Run(const std::vector<Op>& ops) {
    SimOptions sim_options;
    sim_options.seed = config_.sim_seed;
    sim_options.d2h_gbps = sim_options.h2d_gbps = config_.gbps;
    sim_options.duration_jitter = config_.jitter ? 0.3 : 0.0;
    sim_options.record_trace = false;
    sim_ = NewSimBackend(sim_options);
    OffloadOptions options;
    options.model_layers = config_.layers;
    options.offloaded_layers = config_.offloaded;
    options.min_offload_elements = 1024;
    options.keep_host_copies = true;
    options.retain_pinned_buffers = config_.retain_pinned;
    if (config_.budget) {
      options.activation_budget_bytes = config_.BudgetBytes();
      options.smallest_budget = config_.smallest_budget;
    }
    StatusOr<std::unique_ptr<TrainingLoop>> made =
        TrainingLoop::Create(*sim_, options);
    Check(made.status(), "Create");
    loop_ = std::move(*made);
    harness_ = std::make_unique<LoopHarness>(*sim_, *loop_, config_.per_layer);
    sim_->RunUntilIdle();
    device_baseline_ = sim_->device_memory().live_bytes;
    pinned_baseline_ = sim_->pinned_memory().live_bytes;

    for (const Op& op : ops) Step(op);
    Teardown();
  }

  ~Program() {
    // Graphs before the loop, the loop before the backend.
    live_.clear();
    harness_.reset();
    loop_.reset();
  }

 private:
  void Log(const std::string& line) { RC_LOG() << line << "\n"; }
  void Check(const Status& status, const std::string& what) {
    if (!status.ok()) RC_FAIL(what + ": " + status.ToString());
  }
  ModelGraph* Find(int id) {
    for (auto& g : live_) {
      if (g->id == id) return g.get();
    }
    return nullptr;
  }
  void CheckPool() {
    max_live_ = std::max<int>(max_live_, live_.size());
    RC_ASSERT(loop_->pooled_offloaders() <= max_live_ + 1);
    RC_ASSERT(sim_->hazards().empty());
  }

  void Step(const Op& op) {
    const bool after_forward = last_was_forward_;
    last_was_forward_ = false;
    switch (op.kind) {
      case Op::kForward:
        Forward(op);
        break;
      case Op::kAbandon:
        if (after_forward && running_ >= 0) Abandon();
        break;
      case Op::kStrayAbandon:
        if (running_ < 0) StrayAbandon();
        break;
      case Op::kDrop:
        if (!live_.empty()) Drop(op.pick % live_.size());
        break;
      case Op::kDropBelow:
        DropBelow(op);
        break;
      case Op::kBackward:
        Backward(op);
        break;
      case Op::kStep:
        TrainStep(op);
        break;
    }
    CheckPool();
  }

  // Returns the new graph, or nullptr when kMaxLiveGraphs are alive.
  ModelGraph* Forward(const Op& op) {
    if (static_cast<int>(live_.size()) >= kMaxLiveGraphs) return nullptr;
    const int n = config_.layers;
    const int m = 1 + op.count % n;
    const bool expected_ids = op.flag;
    std::string how;
    // A running forward of fewer than n layers would go on with
    // ForwardStep(-1): it is ended first (a context's exit), unless its graph
    // was freed, which the next ForwardStep sees by itself (header: "its
    // graph was freed in the middle of the forward"). Not with k == 0: such
    // a graph held no saved handle, only layer-end markers, and the loop
    // sees a freed graph by its saved handles only (graph_dropped), so the
    // next ForwardStep(-1) goes on with the freed iteration's next layer
    // (reported; a new iteration when the markers go too would also restart
    // callers that keep no marker). Under a byte budget every tensor the
    // loop is shown is a saved handle, so a freed graph is seen as such.
    if (running_ >= 0 && running_layers_ < n && Find(running_) == nullptr) {
      freed_mid_forward_ = true;
    }
    if (running_ >= 0 && running_layers_ < n && !expected_ids) {
      const bool dropped = Find(running_) == nullptr;
      if (!dropped || op.flag2 ||
          (config_.offloaded == 0 && !config_.budget)) {
        loop_->EndForward();
        how = " after EndForward";
      }
    }
    const int id = ++forwards_;
    auto g = std::make_unique<ModelGraph>();
    g->id = id;
    g->layers = m;
    g->graph = harness_->Forward(m, expected_ids);
    Log("G" + std::to_string(id) + " = Forward(" + std::to_string(m) +
        (expected_ids ? ", pre-hook ids" : ", context") + ")" + how);
    Check(harness_->last_error(), "Forward of G" + std::to_string(id));
    std::vector<int> ids;
    for (int i = 0; i < m; ++i) ids.push_back(i);
    RC_ASSERT(g->graph.layers_seen() == ids);
    // A new iteration began: ids grow with each forward.
    RC_ASSERT(g->graph.iteration_id() > last_iteration_id_);
    last_iteration_id_ = g->graph.iteration_id();
    running_ = id;
    running_layers_ = m;
    live_.push_back(std::move(g));
    last_was_forward_ = true;
    return live_.back().get();
  }

  void Abandon() {
    const int before = loop_->live_iterations();
    Log("AbandonForward (G" + std::to_string(running_) + ")");
    Check(loop_->AbandonForward(), "AbandonForward");
    RC_ASSERT(loop_->live_iterations() == before - 1);
    abandoned_ = true;
    if (ModelGraph* g = Find(running_)) {
      g->traversable = false;
      g->why_not = "abandoned";
    }
    running_ = -1;
  }

  void StrayAbandon() {
    const int before = loop_->live_iterations();
    const int64_t bytes = loop_->OffloadedBytes();
    Log("AbandonForward with no forward running");
    Check(loop_->AbandonForward(), "AbandonForward (no forward)");
    RC_ASSERT(loop_->live_iterations() == before);
    RC_ASSERT(loop_->OffloadedBytes() == bytes);
  }

  void Drop(size_t index) {
    Log("Drop G" + std::to_string(live_[index]->id));
    live_.erase(live_.begin() + index);
  }

  void DropBelow(const Op& op) {
    std::vector<ModelGraph*> candidates;
    for (auto& g : live_) {
      if (g->layers >= 2) candidates.push_back(g.get());
    }
    if (candidates.empty()) return;
    ModelGraph& g = *candidates[op.pick % candidates.size()];
    const int below = 1 + op.count % (g.layers - 1);
    Log("G" + std::to_string(g.id) + ".DropLayersBelow(" +
        std::to_string(below) + ")");
    g.graph.DropLayersBelow(below);
    g.dropped_below = std::max(g.dropped_below, below);
  }

  void Backward(const Op& op) {
    std::vector<ModelGraph*> candidates;
    for (auto& g : live_) {
      if (g->traversable) candidates.push_back(g.get());
    }
    if (candidates.empty()) return;
    // A non-empty subset, in an order the pick chooses.
    std::vector<ModelGraph*> chosen;
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (op.pick & (1 << i)) chosen.push_back(candidates[i]);
    }
    if (chosen.empty()) {
      chosen.push_back(candidates[op.pick % candidates.size()]);
    }
    if (op.pick & 8) std::reverse(chosen.begin(), chosen.end());
    std::vector<int> lowest;
    for (size_t i = 0; i < chosen.size(); ++i) {
      const ModelGraph* g = chosen[i];
      const int span = g->layers - g->dropped_below;
      const int raw = i == 0 ? op.lowest0 : i == 1 ? op.lowest1 : op.lowest2;
      lowest.push_back(g->dropped_below + raw % span);
    }
    Pass(chosen, lowest, /*retain=*/op.flag, op.order);
  }

  // A train step: a whole forward, a pass over it down to layer 0, and the
  // graph freed unless retained (then later passes may traverse it again).
  void TrainStep(const Op& op) {
    Op forward;
    forward.kind = Op::kForward;
    forward.count = config_.layers - 1;  // all n layers
    forward.flag = op.flag2;
    Log("Step:");
    ModelGraph* g = Forward(forward);
    if (g == nullptr) return;
    const int id = g->id;
    Pass({g}, {0}, /*retain=*/op.flag, op.order);
    if (!op.flag) {
      for (size_t i = 0; i < live_.size(); ++i) {
        if (live_[i]->id == id) {
          Drop(i);
          break;
        }
      }
    }
  }

  // One backward pass over `chosen`, each down to its `lowest` layer, then
  // PassEnded.
  void Pass(const std::vector<ModelGraph*>& chosen,
            const std::vector<int>& lowest, bool retain, int order) {
    // Per graph: the layers this pass reaches, top down.
    struct Walk {
      ModelGraph* g;
      int next;
      int lowest;
    };
    std::vector<Walk> walks;
    std::ostringstream line;
    line << "Backward(";
    for (size_t i = 0; i < chosen.size(); ++i) {
      ModelGraph* g = chosen[i];
      walks.push_back({g, g->layers - 1, lowest[i]});
      line << (i ? ", " : "") << "G" << g->id << " down to " << lowest[i];
    }
    // Interleaved layer by layer (`order` picks whose layer is next) or one
    // graph after another.
    const bool interleave = (order & 1) != 0;
    line << (retain ? "; retain" : "") << (interleave ? "; interleaved" : "")
         << ") + PassEnded";
    Log(line.str());
    uint32_t state = static_cast<uint32_t>(order) * 2654435761u + 1;
    for (;;) {
      std::vector<Walk*> open;
      for (Walk& w : walks) {
        if (w.next >= w.lowest) open.push_back(&w);
      }
      if (open.empty()) break;
      Walk* w = open.front();
      if (interleave) {
        state = state * 1103515245u + 12345u;
        w = open[(state >> 16) % open.size()];
      }
      const Status stepped =
          harness_->BackwardLayer(w->g->graph, w->next, retain);
      Check(stepped, "G" + std::to_string(w->g->id) + " layer " +
                         std::to_string(w->next));
      --w->next;
    }
    EndPass();
    RC_ASSERT(sim_->hazards().empty());
    for (size_t i = 0; i < chosen.size(); ++i) {
      ModelGraph* g = chosen[i];
      partial_traversed_ |= g->layers < config_.layers;
      full_iterations_ += g->layers == config_.layers && lowest[i] == 0 &&
                          g->traversals == 0;
      second_traversal_ |= g->traversals++ > 0;
      if (g->id == running_) running_ = -1;  // its backward began
      if (!retain) {
        g->traversable = false;
        g->why_not = "traversed without retain_graph";
      }
    }
    several_graphs_ |= chosen.size() > 1;
  }

  // A plan's last line (FormatBudgetPlan): its peak and budget.
  struct PlanLine {
    int64_t peak = -1;
    int64_t budget = -1;
  };
  static PlanLine ReadPlan(const std::string& text) {
    PlanLine out;
    const size_t at = text.find("peak on device ");
    if (at == std::string::npos) return out;
    long long peak = -1, budget = -1;
    if (std::sscanf(text.c_str() + at, "peak on device %lld bytes, budget %lld",
                    &peak, &budget) == 2) {
      out.peak = peak;
      out.budget = budget;
    }
    return out;
  }

  // PassEnded. Without a budget it must succeed. With one, the pooled
  // Offloaders that had no plan before it and have one after it made their
  // plans in it: each keeps its peak within its budget, which is the one
  // asked for (a refused one's: the smallest that fits; smallest_budget's:
  // at least the one asked for); the call may return kResourceExhausted
  // only for such a refusal, naming the budget a plan made in it has.
  void EndPass() {
    const std::vector<const Offloader*> offloaders = loop_->offloaders();
    std::vector<bool> had_plan;
    for (const Offloader* o : offloaders) {
      had_plan.push_back(!o->BudgetPlanText().empty());
    }
    const Status ended = loop_->PassEnded();
    if (!config_.budget) {
      Check(ended, "PassEnded");
      return;
    }
    RC_ASSERT(loop_->offloaders().size() == offloaders.size());
    const int64_t asked = config_.BudgetBytes();
    std::vector<PlanLine> made;
    for (size_t i = 0; i < offloaders.size(); ++i) {
      const std::string text = offloaders[i]->BudgetPlanText();
      if (had_plan[i] || text.empty()) continue;
      const PlanLine plan = ReadPlan(text);
      Log("  plan made: peak " + std::to_string(plan.peak) + ", budget " +
          std::to_string(plan.budget));
      if (plan.budget < 0 || plan.peak < 0) RC_FAIL("unreadable plan:\n" + text);
      RC_ASSERT(plan.peak <= plan.budget);
      if (config_.smallest_budget) {
        RC_ASSERT(plan.budget >= asked);
      } else if (plan.budget != asked) {
        // Only a refused budget is planned for another one (the smallest
        // that fits, which is more).
        RC_ASSERT(plan.budget > asked);
        RC_ASSERT(ended.code() == StatusCode::kResourceExhausted);
      }
      made.push_back(plan);
    }
    plans_made_ += made.size();
    if (ended.ok()) return;
    if (ended.code() != StatusCode::kResourceExhausted ||
        config_.smallest_budget) {
      Check(ended, "PassEnded");
    }
    const std::string message = ended.ToString();
    Log("  PassEnded: " + message);
    if (message.find("smallest budget that fits") == std::string::npos) {
      Check(ended, "PassEnded (not a refused budget)");
    }
    long long fits = -1;
    const size_t at = message.find("planned for ");
    if (at == std::string::npos ||
        std::sscanf(message.c_str() + at, "planned for %lld bytes", &fits) !=
            1) {
      RC_FAIL("a refused budget naming no budget planned for: " + message);
    }
    RC_ASSERT(fits > asked);
    bool named = false;
    for (const PlanLine& plan : made) named |= plan.budget == fits;
    if (!named) {
      RC_FAIL("PassEnded refused the budget without making a plan for " +
              std::to_string(fits) + " bytes in it: " + message);
    }
    ++refusals_;
    RC_ASSERT(refusals_ <= plans_made_);
  }

  // Ends the program: a forward still running is ended (a context's exit)
  // or raises (AbandonForward) — one whose graph was freed in the middle of
  // its forward is abandoned only at the next forward otherwise — then every
  // graph goes.
  void Teardown() {
    if (running_ >= 0) {
      const bool alive = Find(running_) != nullptr;
      const bool partial = running_layers_ < config_.layers;
      if (!alive && partial) {
        Log("teardown: AbandonForward (G" + std::to_string(running_) +
            " freed in its forward)");
        Check(loop_->AbandonForward(), "AbandonForward at teardown");
      } else if (alive && (config_.teardown & 3) == 1) {
        Log("teardown: AbandonForward");
        Check(loop_->AbandonForward(), "AbandonForward at teardown");
      } else if (alive && (partial || (config_.teardown & 3) == 2)) {
        Log("teardown: EndForward");
        loop_->EndForward();
      }
    }
    // Every graph goes, in an order teardown picks.
    if (config_.teardown & 4) std::reverse(live_.begin(), live_.end());
    while (!live_.empty()) {
      const size_t index = (config_.teardown >> 3) % live_.size();
      Drop(index);
    }
    sim_->RunUntilIdle();
    RC_ASSERT(sim_->hazards().empty());
    RC_ASSERT(loop_->live_iterations() == 0);
    for (const Offloader* o : loop_->offloaders()) {
      bytes_offloaded_ += o->stats().bytes_offloaded;
    }
    // No failure went unreported (the loop warns where it has nobody to
    // tell).
    for (const std::string& w : loop_->diagnostics().warnings()) {
      if (w.find("ending an iteration") != std::string::npos) {
        RC_FAIL("warned: " + w);
      }
    }
    RC_ASSERT(sim_->device_memory().live_bytes == device_baseline_);
    const int64_t pinned = sim_->pinned_memory().live_bytes - pinned_baseline_;
    RC_ASSERT(pinned == loop_->OffloadedBytes());
    if (!config_.retain_pinned) RC_ASSERT(loop_->OffloadedBytes() == 0);
    RC_ASSERT(loop_->pooled_offloaders() <= max_live_ + 1);
    // The loop gone, its pool goes with the retained buffers.
    loop_.reset();
    sim_->RunUntilIdle();
    RC_ASSERT(sim_->pinned_memory().live_bytes == pinned_baseline_);
    RC_ASSERT(sim_->device_memory().live_bytes == device_baseline_);
    RC_ASSERT(sim_->hazards().empty());
  }

  const Config config_;
  // Declared first: destroyed last.
  std::unique_ptr<SimBackend> sim_;
  std::unique_ptr<TrainingLoop> loop_;
  std::unique_ptr<LoopHarness> harness_;
  std::vector<std::unique_ptr<ModelGraph>> live_;
  int64_t device_baseline_ = 0;
  int64_t pinned_baseline_ = 0;
  int forwards_ = 0;
  uint64_t last_iteration_id_ = 0;
  int running_ = -1;  // the graph whose forward the loop runs, if any
  int running_layers_ = 0;
  bool last_was_forward_ = false;
  int max_live_ = 0;

 public:
  // Coverage, for RC_CLASSIFY.
  bool several_graphs_ = false;
  bool abandoned_ = false;
  bool partial_traversed_ = false;
  bool freed_mid_forward_ = false;
  bool second_traversal_ = false;
  int full_iterations_ = 0;  // whole forwards traversed down to layer 0
  int64_t bytes_offloaded_ = 0;  // over every pooled Offloader
  size_t plans_made_ = 0;
  size_t refusals_ = 0;
};

// SPEC §7.1–7.4 with §6.3 and §6.4: any interleaving of forwards, abandoned
// forwards, freed graphs and parts of graphs, and backward passes gives
// every traversable graph its bytes back, with no hazard and nothing held
// once the graphs are gone.
RC_GTEST_PROP(TrainingLoopProperties, RandomInterleavingsKeepBytesAndMemory,
              ()) {
  const Config config = *GenConfig(/*budget=*/false);
  const std::vector<Op> ops = *rc::gen::container<std::vector<Op>>(
      *rc::gen::inRange(1, 41), GenOp(/*budget=*/false));
  RC_LOG() << "n=" << config.layers << " k=" << config.offloaded
           << " tensors/layer=" << config.per_layer
           << (config.retain_pinned ? " retain_pinned_buffers" : "") << "\n";
  Program program(config);
  program.Run(ops);
  RC_CLASSIFY(program.second_traversal_, "a graph traversed again");
  RC_CLASSIFY(program.several_graphs_, "a pass over several graphs");
  RC_CLASSIFY(program.partial_traversed_, "a partial forward traversed");
  RC_CLASSIFY(program.abandoned_ || program.freed_mid_forward_,
              "a forward abandoned or freed mid-way");
}

// SPEC §4.7 with §7.1–7.4: the same programs, with train steps among them,
// under a byte budget. Each pooled Offloader records its first iteration
// and follows the plan made from it; a budget no plan keeps is refused once
// per plan made (kResourceExhausted from the PassEnded that made it, naming
// the smallest budget that fits, planned for instead) and never with
// smallest_budget; everything else as without a budget.
RC_GTEST_PROP(TrainingLoopProperties,
              RandomInterleavingsUnderAByteBudgetKeepBytesAndMemory, ()) {
  const Config config = *GenConfig(/*budget=*/true);
  const std::vector<Op> ops = *rc::gen::container<std::vector<Op>>(
      *rc::gen::inRange(1, 41), GenOp(/*budget=*/true));
  RC_LOG() << "n=" << config.layers << " tensors/layer=" << config.per_layer
           << (config.retain_pinned ? " retain_pinned_buffers" : "")
           << " budget=" << config.BudgetBytes() << " of "
           << config.SavedBytes()
           << (config.smallest_budget ? " smallest_budget" : "") << "\n";
  Program program(config);
  program.Run(ops);
  RC_CLASSIFY(program.full_iterations_ >= 3, ">= 3 whole iterations");
  RC_CLASSIFY(program.bytes_offloaded_ > 0, "bytes offloaded");
  RC_CLASSIFY(program.refusals_ > 0, "a budget refused");
  RC_CLASSIFY(program.second_traversal_, "a graph traversed again");
  RC_CLASSIFY(program.second_traversal_ && program.bytes_offloaded_ > 0,
              "traversed again, with bytes offloaded");
  RC_CLASSIFY(program.several_graphs_, "a pass over several graphs");
  RC_CLASSIFY(program.abandoned_ || program.freed_mid_forward_,
              "a forward abandoned or freed mid-way");
}

}  // namespace
}  // namespace offload
