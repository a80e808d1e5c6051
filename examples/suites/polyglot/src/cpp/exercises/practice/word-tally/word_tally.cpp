#include "word_tally.h"

namespace word_tally {

std::string most_common(const std::string& text) {
    (void)text;
    return "not implemented";
}

}  // namespace word_tally
