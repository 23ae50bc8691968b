#include "model/lowrank/sym_eigen.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kvserve {

SymmetricEigenResult SymmetricEigen(int n, std::vector<double> a) {
  auto at = [&](int i, int j) -> double& { return a[static_cast<size_t>(i) * n + j]; };
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) at(i, j) = at(j, i);
  }
  std::vector<double> v(static_cast<size_t>(n) * n, 0.0);  // columns are eigenvectors
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i) * n + i] = 1.0;
  SymmetricEigenResult out;
  double scale = 0;
  for (int i = 0; i < n; ++i) scale = std::max(scale, std::fabs(at(i, i)));
  constexpr int kMaxSweeps = 64;
  for (; out.sweeps < kMaxSweeps; ++out.sweeps) {
    double off = 0;
    for (int i = 0; i < n; ++i) {
      for (int j = i + 1; j < n; ++j) off += at(i, j) * at(i, j);
    }
    if (off <= 1e-30 * std::max(scale * scale, 1e-300)) break;
    for (int p = 0; p < n; ++p) {
      for (int q = p + 1; q < n; ++q) {
        const double apq = at(p, q);
        if (std::fabs(apq) < 1e-300) continue;
        // The rotation that zeroes a[p][q] (Golub & Van Loan, 8.4.2).
        const double theta = (at(q, q) - at(p, p)) / (2 * apq);
        const double t =
            (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int k = 0; k < n; ++k) {  // columns p, q
          const double akp = at(k, p), akq = at(k, q);
          at(k, p) = c * akp - s * akq;
          at(k, q) = s * akp + c * akq;
        }
        for (int k = 0; k < n; ++k) {  // rows p, q
          const double apk = at(p, k), aqk = at(q, k);
          at(p, k) = c * apk - s * aqk;
          at(q, k) = s * apk + c * aqk;
        }
        for (int k = 0; k < n; ++k) {
          double& vkp = v[static_cast<size_t>(k) * n + p];
          double& vkq = v[static_cast<size_t>(k) * n + q];
          const double x = vkp, y = vkq;
          vkp = c * x - s * y;
          vkq = s * x + c * y;
        }
      }
    }
  }
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return at(x, x) > at(y, y); });
  out.values.resize(n);
  out.vectors.resize(static_cast<size_t>(n) * n);
  for (int i = 0; i < n; ++i) {
    out.values[i] = at(order[i], order[i]);
    for (int k = 0; k < n; ++k) {
      out.vectors[static_cast<size_t>(i) * n + k] = v[static_cast<size_t>(k) * n + order[i]];
    }
  }
  return out;
}

}  // namespace kvserve
