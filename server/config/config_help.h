// The names and help texts of the serve config's keys: ServeConfigKeyHelp
// (declared in server/config/config.h, shown by `kvserve serve --help`), and the
// value lists the parser and the help share, generated from the cache's own
// tables so that neither can list a name the cache does not take.
#pragma once

#include <string>
#include <vector>

namespace kvserve {

// The eviction policies' names, as the cache spells them.
std::vector<std::string> EvictionPolicyNames();
// The KV page formats' names (the CPU's), as the cache spells them.
std::vector<std::string> KvDtypeNames();
// "a, b, c or d" of the names.
std::string OneOf(const std::vector<std::string>& names);

}  // namespace kvserve
