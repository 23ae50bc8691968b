// The OpenAI parser tests' served model: a byte-level tokenizer ("hi" with
// BOS is {1, 3 + 'h', 3 + 'i'}), the plain chat template, the name "tiny".
#pragma once

#include <cstdint>
#include <memory>

#include "model/chat/chat_template.h"
#include "model/tokenizer/tokenizer.h"
#include "server/openai/openai_protocol.h"

namespace kvserve::testing {

struct ApiFixture {
  std::unique_ptr<Tokenizer> tokenizer = Tokenizer::ByteLevel(512);
  ChatTemplate chat_template;
  int32_t max_model_len = 64;
  ApiContext ctx() const {
    ApiContext c;
    c.tokenizer = tokenizer.get();
    c.chat_template = &chat_template;
    c.model_name = "tiny";
    c.max_model_len = max_model_len;
    return c;
  }
};

}  // namespace kvserve::testing
