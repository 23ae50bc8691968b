// Helpers shared by the libFuzzer targets of tests/fuzz: where the reference
// tokenizer lives, and a check that aborts (so libFuzzer records the input as
// a crash) when a property every input must keep is broken.
//
// Thread-safety: libFuzzer calls a target from one thread.
#pragma once

#include <cstdio>
#include <cstdlib>

// Like assert, but also in NDEBUG builds.
#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)
