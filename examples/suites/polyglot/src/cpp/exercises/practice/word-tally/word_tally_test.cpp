#include "word_tally.h"
#include "test/catch.hpp"

TEST_CASE("empty_text") { REQUIRE(word_tally::most_common("") == ""); }

TEST_CASE("case_is_ignored") { REQUIRE(word_tally::most_common("Go go GO stop") == "go"); }

TEST_CASE("punctuation_separates_words") {
    REQUIRE(word_tally::most_common("red,blue;red.") == "red");
}

TEST_CASE("ties_go_to_the_first_alphabetically") {
    REQUIRE(word_tally::most_common("pear apple pear apple") == "apple");
}
