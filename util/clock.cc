#include "util/clock.h"

namespace kvserve {
namespace {

class RealClockImpl final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace

std::shared_ptr<const Clock> RealClock() {
  static const auto* clock = new std::shared_ptr<const Clock>(std::make_shared<RealClockImpl>());
  return *clock;
}

}  // namespace kvserve
