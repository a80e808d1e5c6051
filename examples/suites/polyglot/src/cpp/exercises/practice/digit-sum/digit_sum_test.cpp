#include "digit_sum.h"
#include "test/catch.hpp"

#include <stdexcept>

TEST_CASE("zero") { REQUIRE(digit_sum::sum(0) == 0); }

TEST_CASE("several_digits") { REQUIRE(digit_sum::sum(1907) == 17); }

TEST_CASE("large_number") { REQUIRE(digit_sum::sum(999999999999LL) == 108); }

TEST_CASE("negative_is_an_error") { REQUIRE_THROWS_AS(digit_sum::sum(-5), std::domain_error); }
