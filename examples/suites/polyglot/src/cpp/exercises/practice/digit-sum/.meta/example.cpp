#include "digit_sum.h"

#include <stdexcept>

namespace digit_sum {

int sum(long long n) {
    if (n < 0) throw std::domain_error("negative number");
    int total = 0;
    for (; n > 0; n /= 10) total += static_cast<int>(n % 10);
    return total;
}

}  // namespace digit_sum
