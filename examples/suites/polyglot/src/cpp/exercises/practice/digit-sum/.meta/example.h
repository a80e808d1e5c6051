#pragma once

namespace digit_sum {

// The sum of the decimal digits of n; throws std::domain_error when n is negative.
int sum(long long n);

}  // namespace digit_sum
