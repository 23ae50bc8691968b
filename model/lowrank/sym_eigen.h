// SymmetricEigen: eigenvalues and eigenvectors of a small dense symmetric
// matrix by the cyclic Jacobi method, in double. The calibration's
// eigenproblems are a group's kv width square (tens to a few hundred), where
// Jacobi is simple, accurate to a few ulps of the largest eigenvalue and
// fast enough; it keeps kvserve free of a linear-algebra dependency.
//
// Thread-safety: a pure function.
#pragma once

#include <vector>

namespace kvserve {

struct SymmetricEigenResult {
  std::vector<double> values;   // [n], descending
  std::vector<double> vectors;  // [n][n]: row i is the unit eigenvector of values[i]
  int sweeps = 0;               // Jacobi sweeps until the off-diagonal vanished
};

// a: [n][n], symmetric (only its lower triangle is read).
SymmetricEigenResult SymmetricEigen(int n, std::vector<double> a);

}  // namespace kvserve
