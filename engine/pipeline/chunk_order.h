// ChunkOrder: the order in which a pipeline rank's model chunks run their
// backward (SPEC §5.2), built as their forwards start.
//
// A chunk is (virtual stage, microbatch), named by the caller. Forward order
// is the order chunks start. Backward order reproduces interleaved 1F1B: a
// chunk of the last virtual stage joins the backward order when its forward
// starts; whenever the last stage has as many chunks as stage 0, the chunks
// of stages vpp-2 ... 0 not yet ordered join, stage by stage, each in
// forward order. With one stage the backward order is the forward order.
// Pure bookkeeping: no device work.

#ifndef OFFLOAD_ENGINE_PIPELINE_CHUNK_ORDER_H_
#define OFFLOAD_ENGINE_PIPELINE_CHUNK_ORDER_H_

#include <string>
#include <vector>

#include "engine/pipeline_summary.h"
#include "engine/status.h"

namespace offload {

class ChunkOrder {
 public:
  // REQUIRES: stages >= 1.
  explicit ChunkOrder(int stages) : per_stage_(stages), ordered_(stages, 0) {}

  // Records that the forward of chunk `index` (its position in forward
  // order) of `stage` started. REQUIRES: 0 <= stage < stages, and `index`
  // is the number of chunks added before.
  void AddForward(int index, int stage);

  // Chunk indices in backward order, as far as it is known.
  const std::vector<int>& backward() const { return backward_; }

  // OK if every stage has as many chunks as stage 0 (so that every chunk
  // is in the backward order). Errors: kFailedPrecondition naming the
  // counts.
  Status CheckComplete() const;

 private:
  std::vector<std::vector<int>> per_stage_;  // chunk indices, forward order
  std::vector<size_t> ordered_;  // per stage: how many joined backward_
  std::vector<int> backward_;
};

}  // namespace offload

#endif  // OFFLOAD_ENGINE_PIPELINE_CHUNK_ORDER_H_
