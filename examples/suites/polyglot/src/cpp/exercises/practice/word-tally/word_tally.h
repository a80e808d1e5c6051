#pragma once

#include <string>

namespace word_tally {

// The most frequent word of text in lower case ("" when it has no word).
std::string most_common(const std::string& text);

}  // namespace word_tally
