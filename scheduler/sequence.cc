#include "scheduler/sequence.h"

namespace kvserve {

Sequence::Sequence(SeqId id, RequestState* request, int32_t index, uint64_t seed,
                   const Tokenizer* tokenizer)
    : id(id),
      request(request),
      index(index),
      tokens(request->prompt_ids),
      seed(seed),
      rng(seed),
      detok(tokenizer, request->prompt_ids.back()),
      stop(request->params.stop) {
  tokens.reserve(request->prompt_ids.size() + request->params.max_tokens);
  out.index = index;
}

}  // namespace kvserve
