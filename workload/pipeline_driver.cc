#include "workload/pipeline_driver.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "workload/tensor_util.h"

namespace offload {

Status ValidatePipelineSpec(const PipelineSpec& spec) {
  auto invalid = [](const std::string& why) {
    return InvalidArgumentError("PipelineSpec: " + why);
  };
  if (spec.pp < 1 || spec.vpp < 1 || spec.microbatches < 1 ||
      spec.layers < 1) {
    return invalid("pp, vpp, microbatches and layers must be at least 1");
  }
  if (spec.tokens < 1 || spec.hidden < 1 || spec.ffn < 1 ||
      spec.compute_ns_per_mib < 0) {
    return invalid("tokens, hidden and ffn must be at least 1");
  }
  if (spec.vpp > 1 && spec.microbatches % spec.pp != 0) {
    return invalid("with vpp > 1 (interleaved 1F1B) microbatches (" +
                   std::to_string(spec.microbatches) +
                   ") must be a multiple of pp (" + std::to_string(spec.pp) +
                   ")");
  }
  return OkStatus();
}

std::vector<PipelineStep> RankSchedule(const PipelineSpec& spec, int rank) {
  const int pp = spec.pp, vpp = spec.vpp, m = spec.microbatches;
  const int total = m * vpp;
  // Megatron's chunk of the k-th forward (or backward) of the rank.
  auto chunk = [&](int k, bool forward) {
    const int group = pp * vpp;
    int stage = (k % group) / pp;
    if (!forward) stage = vpp - 1 - stage;
    return ChunkId{stage, (k / group) * pp + k % pp};
  };
  const int warmup =
      vpp == 1 ? std::min(pp - rank - 1, m)
               : std::min((pp - rank - 1) * 2 + (vpp - 1) * pp, total);
  std::vector<PipelineStep> steps;
  int f = 0, b = 0;
  for (; f < warmup; ++f) steps.push_back({true, chunk(f, true)});
  while (f < total) {
    steps.push_back({true, chunk(f++, true)});
    steps.push_back({false, chunk(b++, false)});
  }
  while (b < total) steps.push_back({false, chunk(b++, false)});
  return steps;
}

namespace {

constexpr int64_t kMiB = 1024 * 1024;

struct Saved {
  SavedTensor handle;
  Tensor geometry;  // the pushed view, without its storage
  uint64_t seed = 0;
};

// What a chunk's forward did, for its backward to replay in reverse.
struct GroupEvent {
  bool commit = false;
  std::string name;
  int layer = 0;             // the layer of the chunk it belongs to
  std::vector<Saved> saved;  // commit events: the group's pushes
};

struct Check {
  BytesFuture future;
  Tensor geometry;  // no storage: a check keeps no memory alive
  uint64_t seed = 0;
  int chunk = 0;
};

class RankRunner {
 public:
  RankRunner(Backend& backend, PipelineOffloader& offloader,
             const PipelineSpec& spec, const WorkloadHooks& hooks,
             const PipelineRunOptions& options)
      : backend_(backend),
        offloader_(offloader),
        spec_(spec),
        hooks_(hooks),
        options_(options) {}

  Status Iteration(const std::vector<PipelineStep>& steps, int iteration,
                   PipelineRankResult& result);

 private:
  StatusOr<Tensor> Make(std::vector<int64_t> shape, const std::string& name) {
    OFFLOAD_ASSIGN_OR_RETURN(
        Tensor t, hooks_.make_tensor(backend_, spec_.dtype, std::move(shape),
                                     next_seed_));
    t.name = name;
    seeds_[t.storage.get()] = next_seed_++;
    return t;
  }
  // "<op> [<group> of chunk (stage s, microbatch m)]": what a compute
  // call is named (pipeline_driver.h).
  static std::string Attributed(const std::string& op,
                                const std::string& group, const ChunkId& id) {
    return op + " [" + group + " of " + id.ToString() + "]";
  }
  Status Compute(const std::string& name, std::vector<const Tensor*> reads,
                 std::vector<const Tensor*> writes, int factor = 1) {
    int64_t bytes = 0;
    for (const Tensor* t : writes) bytes += t->nbytes();
    for (const Tensor* t : reads) bytes += writes.empty() ? t->nbytes() : 0;
    ComputeCall call{name, factor * spec_.compute_ns_per_mib * bytes / kMiB,
                     std::move(reads), std::move(writes)};
    return hooks_.compute(backend_.ComputeStream(), call);
  }
  Status Start(std::vector<GroupEvent>& events, const std::string& name) {
    OFFLOAD_RETURN_IF_ERROR(offloader_.GroupStart(name));
    events.push_back(GroupEvent{false, name, layer_, {}});
    open_.push_back(events.size() - 1);
    return OkStatus();
  }
  Status Push(std::vector<GroupEvent>& events, const Tensor& t) {
    OFFLOAD_ASSIGN_OR_RETURN(SavedTensor handle, offloader_.Push(t));
    Tensor geometry = t;
    geometry.storage = nullptr;
    geometry.ready = nullptr;
    events[open_.back()].saved.push_back(
        Saved{std::move(handle), std::move(geometry), seeds_[t.storage.get()]});
    return OkStatus();
  }
  Status Commit(std::vector<GroupEvent>& events, const std::string& name,
                const std::vector<Tensor>& release) {
    if (options_.around_commit) {
      options_.around_commit(iteration_, chunk_, name, false);
    }
    OFFLOAD_RETURN_IF_ERROR(offloader_.GroupCommit(name, release));
    if (options_.around_commit) {
      options_.around_commit(iteration_, chunk_, name, true);
    }
    GroupEvent commit{true, name, layer_,
                      std::move(events[open_.back()].saved)};
    open_.pop_back();
    events.push_back(std::move(commit));
    return OkStatus();
  }
  Status Layer(std::vector<GroupEvent>& events, Tensor& x, int layer);
  Status Forward(const ChunkId& id, std::vector<GroupEvent>& events);
  Status Backward(const ChunkId& id, int chunk_index,
                  std::vector<GroupEvent>& events, std::vector<Check>& checks);

  Backend& backend_;
  PipelineOffloader& offloader_;
  const PipelineSpec spec_;
  const WorkloadHooks hooks_;  // complete (CompleteHooks)
  const PipelineRunOptions options_;
  uint64_t next_seed_ = 1;
  std::map<const Storage*, uint64_t> seeds_;
  std::vector<size_t> open_;  // indices of open groups' start events
  int iteration_ = 0;         // for around_commit
  ChunkId chunk_;             // the chunk whose forward runs
  int layer_ = 0;             // the layer whose forward runs
};

Status RankRunner::Layer(std::vector<GroupEvent>& events, Tensor& x,
                         int layer) {
  const int64_t t = spec_.tokens, h = spec_.hidden, f = spec_.ffn;
  const std::string l = "L" + std::to_string(layer) + ".";
  layer_ = layer;
  // A forward compute call, of the innermost open group.
  auto compute = [&](const std::string& op, std::vector<const Tensor*> reads,
                     std::vector<const Tensor*> writes) {
    return Compute(Attributed(l + op, events[open_.back()].name, chunk_),
                   std::move(reads), std::move(writes));
  };
  OFFLOAD_RETURN_IF_ERROR(Start(events, "attn_norm"));
  OFFLOAD_RETURN_IF_ERROR(Push(events, x));
  OFFLOAD_ASSIGN_OR_RETURN(Tensor ln, Make({t, h}, l + "ln"));
  OFFLOAD_RETURN_IF_ERROR(compute("input_norm", {&x}, {&ln}));
  OFFLOAD_RETURN_IF_ERROR(Start(events, "qkv_linear"));
  OFFLOAD_RETURN_IF_ERROR(Push(events, ln));
  OFFLOAD_ASSIGN_OR_RETURN(Tensor qkv, Make({t, 3 * h}, l + "qkv"));
  OFFLOAD_RETURN_IF_ERROR(compute("qkv_linear", {&ln}, {&qkv}));
  ln = Tensor();
  OFFLOAD_RETURN_IF_ERROR(Commit(events, "qkv_linear", {}));
  OFFLOAD_RETURN_IF_ERROR(Start(events, "core_attn"));
  for (int part = 0; part < 3; ++part) {  // interleaved q, k, v views
    Tensor view = qkv;
    view.shape = {t, h};
    view.strides = {3 * h, 1};
    view.offset = part * h;
    view.name = l + std::string(1, "qkv"[part]);
    OFFLOAD_RETURN_IF_ERROR(Push(events, view));
  }
  OFFLOAD_ASSIGN_OR_RETURN(Tensor attn, Make({t, h}, l + "attn_out"));
  OFFLOAD_RETURN_IF_ERROR(compute("core_attn", {&qkv}, {&attn}));
  OFFLOAD_RETURN_IF_ERROR(Commit(events, "core_attn", {qkv}));
  qkv = Tensor();
  OFFLOAD_RETURN_IF_ERROR(Start(events, "attn_proj"));
  OFFLOAD_RETURN_IF_ERROR(Push(events, attn));
  OFFLOAD_ASSIGN_OR_RETURN(Tensor proj, Make({t, h}, l + "proj"));
  OFFLOAD_RETURN_IF_ERROR(compute("attn_proj", {&attn}, {&proj}));
  OFFLOAD_RETURN_IF_ERROR(Commit(events, "attn_proj", {attn}));
  attn = Tensor();
  OFFLOAD_ASSIGN_OR_RETURN(Tensor hidden, Make({t, h}, l + "h"));
  OFFLOAD_RETURN_IF_ERROR(compute("attn_residual", {&x, &proj}, {&hidden}));
  proj = Tensor();
  OFFLOAD_RETURN_IF_ERROR(Commit(events, "attn_norm", {x}));
  x = Tensor();

  OFFLOAD_RETURN_IF_ERROR(Start(events, "mlp_norm"));
  OFFLOAD_RETURN_IF_ERROR(Push(events, hidden));
  OFFLOAD_ASSIGN_OR_RETURN(Tensor ln2, Make({t, h}, l + "ln2"));
  OFFLOAD_RETURN_IF_ERROR(compute("pre_mlp_norm", {&hidden}, {&ln2}));
  OFFLOAD_RETURN_IF_ERROR(Start(events, "expert_fc1"));
  OFFLOAD_RETURN_IF_ERROR(Push(events, ln2));
  OFFLOAD_ASSIGN_OR_RETURN(Tensor fc1, Make({t, f}, l + "fc1_out"));
  OFFLOAD_RETURN_IF_ERROR(compute("expert_fc1", {&ln2}, {&fc1}));
  OFFLOAD_RETURN_IF_ERROR(Commit(events, "expert_fc1", {ln2}));
  ln2 = Tensor();
  OFFLOAD_RETURN_IF_ERROR(Start(events, "moe_act"));
  OFFLOAD_RETURN_IF_ERROR(Push(events, fc1));
  OFFLOAD_ASSIGN_OR_RETURN(Tensor act, Make({t, f}, l + "act_out"));
  OFFLOAD_RETURN_IF_ERROR(compute("moe_act", {&fc1}, {&act}));
  OFFLOAD_RETURN_IF_ERROR(Push(events, act));  // saved by fc2
  OFFLOAD_ASSIGN_OR_RETURN(Tensor fc2, Make({t, h}, l + "fc2_out"));
  OFFLOAD_RETURN_IF_ERROR(compute("expert_fc2", {&act}, {&fc2}));
  // Committed after fc2 (upstream's deferred moe_act commit).
  OFFLOAD_RETURN_IF_ERROR(Commit(events, "moe_act", {fc1, act}));
  fc1 = act = Tensor();
  OFFLOAD_ASSIGN_OR_RETURN(Tensor out, Make({t, h}, l + "out"));
  OFFLOAD_RETURN_IF_ERROR(compute("mlp_residual", {&hidden, &fc2}, {&out}));
  fc2 = Tensor();
  OFFLOAD_RETURN_IF_ERROR(Commit(events, "mlp_norm", {hidden}));
  x = std::move(out);
  return OkStatus();
}

Status RankRunner::Forward(const ChunkId& id, std::vector<GroupEvent>& events) {
  OFFLOAD_RETURN_IF_ERROR(offloader_.StartChunk(id.stage, id.microbatch));
  chunk_ = id;
  OFFLOAD_ASSIGN_OR_RETURN(Tensor x,
                           Make({spec_.tokens, spec_.hidden}, "input"));
  for (int layer = 0; layer < spec_.layers; ++layer) {
    OFFLOAD_RETURN_IF_ERROR(Layer(events, x, layer));
  }
  return OkStatus();  // x, the chunk's output, goes to the next stage
}

Status RankRunner::Backward(const ChunkId& id, int chunk_index,
                            std::vector<GroupEvent>& events,
                            std::vector<Check>& checks) {
  OFFLOAD_RETURN_IF_ERROR(
      offloader_.StartChunkBackward(id.stage, id.microbatch));
  for (auto event = events.rbegin(); event != events.rend(); ++event) {
    if (!event->commit) {
      OFFLOAD_RETURN_IF_ERROR(offloader_.GroupBackwardEnd(event->name));
      continue;
    }
    OFFLOAD_RETURN_IF_ERROR(offloader_.GroupBackwardStart(event->name));
    std::vector<Tensor> popped;
    for (Saved& saved : event->saved) {
      OFFLOAD_ASSIGN_OR_RETURN(Tensor t, offloader_.Pop(saved.handle));
      if (options_.check_bytes) {
        OFFLOAD_ASSIGN_OR_RETURN(BytesFuture future,
                                 hooks_.capture(backend_, t));
        checks.push_back(
            Check{std::move(future), saved.geometry, saved.seed, chunk_index});
      }
      popped.push_back(std::move(t));
    }
    std::vector<const Tensor*> reads;
    for (const Tensor& t : popped) reads.push_back(&t);
    OFFLOAD_RETURN_IF_ERROR(Compute(
        Attributed("backward L" + std::to_string(event->layer) + "." +
                       event->name,
                   event->name, id),
        std::move(reads), {}, 2));
  }
  events.clear();
  return OkStatus();
}

Status RankRunner::Iteration(const std::vector<PipelineStep>& steps,
                             int iteration, PipelineRankResult& result) {
  iteration_ = iteration;
  const int64_t start = hooks_.clock ? hooks_.clock() : 0;
  std::map<std::pair<int, int>, std::vector<GroupEvent>> events;
  std::map<std::pair<int, int>, int> index;
  std::vector<Check> checks;
  for (const PipelineStep& step : steps) {
    const std::pair<int, int> key{step.chunk.stage, step.chunk.microbatch};
    const std::string where = "iteration " + std::to_string(iteration) +
                              (step.forward ? " forward of " : " backward of ") +
                              step.chunk.ToString();
    Status status;
    if (step.forward) {
      index.emplace(key, static_cast<int>(index.size()));
      status = Forward(step.chunk, events[key]);
    } else {
      status = Backward(step.chunk, index[key], events[key], checks);
    }
    if (!status.ok()) {
      (void)backend_.ComputeStream().Synchronize();  // before captures drop
      return status.WithContext(where);
    }
  }
  OFFLOAD_RETURN_IF_ERROR(offloader_.FinishIteration().WithContext(
      "iteration " + std::to_string(iteration)));
  OFFLOAD_RETURN_IF_ERROR(backend_.ComputeStream().Synchronize());
  if (hooks_.clock) result.iteration_ns.push_back(hooks_.clock() - start);
  for (Check& check : checks) {
    OFFLOAD_ASSIGN_OR_RETURN(std::vector<uint8_t> got, check.future());
    std::vector<uint8_t> want =
        PatternTensorBytes(check.geometry, check.seed);
    ++result.tensors_checked;
    result.bytes_checked += static_cast<int64_t>(want.size());
    if (got != want) {
      result.mismatches.push_back(Mismatch{iteration, check.chunk,
                                           check.geometry.name,
                                           "popped bytes differ"});
    }
  }
  if (options_.after_iteration) options_.after_iteration(iteration);
  ++result.iterations;
  return OkStatus();
}

}  // namespace

StatusOr<PipelineRankResult> RunPipelineRank(
    Backend& backend, PipelineOffloader& offloader, const PipelineSpec& spec,
    int rank, const WorkloadHooks& hooks, const PipelineRunOptions& options) {
  OFFLOAD_RETURN_IF_ERROR(ValidatePipelineSpec(spec));
  if (rank < 0 || rank >= spec.pp) {
    return InvalidArgumentError("RunPipelineRank: rank " +
                                std::to_string(rank) + " outside [0, " +
                                std::to_string(spec.pp) + ")");
  }
  OFFLOAD_ASSIGN_OR_RETURN(WorkloadHooks complete,
                           CompleteHooks(hooks, "RunPipelineRank"));
  RankRunner runner(backend, offloader, spec, complete, options);
  const std::vector<PipelineStep> steps = RankSchedule(spec, rank);
  PipelineRankResult result;
  for (int i = 0; i < options.iterations; ++i) {
    OFFLOAD_RETURN_IF_ERROR(runner.Iteration(steps, i, result));
  }
  return result;
}

}  // namespace offload
