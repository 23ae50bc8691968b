// RequestStream: outputs in order, end after close, and cancellation as an
// event a producer can wait on.
#include "scheduler/request_stream.h"

#include <catch2/catch.hpp>
#include <thread>

#include "absl/time/clock.h"

namespace kvserve {
namespace {

TEST_CASE("A stream hands over outputs in order, then ends", "[scheduler]") {
  RequestStream s("r1");
  GenerateOutput out;
  REQUIRE(s.TryNext(&out) == RequestStream::Pop::kTimeout);
  for (int32_t t : {5, 6}) {
    GenerateOutput o;
    o.token_ids = {t};
    s.Push(std::move(o));
  }
  s.Close();
  REQUIRE(s.Next(&out) == RequestStream::Pop::kOutput);
  REQUIRE(out.token_ids == std::vector<int32_t>{5});
  REQUIRE(s.Next(&out) == RequestStream::Pop::kOutput);
  REQUIRE(out.token_ids == std::vector<int32_t>{6});
  REQUIRE(s.Next(&out) == RequestStream::Pop::kEnd);
}

TEST_CASE("AwaitCancelled wakes on Cancel, not on its timeout", "[scheduler]") {
  RequestStream s("r1");
  REQUIRE_FALSE(s.AwaitCancelled(absl::ZeroDuration()));
  bool woke_cancelled = false;
  absl::Duration waited;
  std::thread producer([&] {
    const absl::Time start = absl::Now();
    woke_cancelled = s.AwaitCancelled(absl::Hours(1));
    waited = absl::Now() - start;
  });
  s.Cancel();
  producer.join();
  REQUIRE(woke_cancelled);
  REQUIRE(waited < absl::Hours(1));
  REQUIRE(s.cancelled());
  REQUIRE(s.AwaitCancelled(absl::ZeroDuration()));
}

}  // namespace
}  // namespace kvserve
