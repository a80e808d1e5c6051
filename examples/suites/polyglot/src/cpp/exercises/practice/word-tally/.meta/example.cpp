#include "word_tally.h"

#include <map>

namespace word_tally {

std::string most_common(const std::string& text) {
    std::map<std::string, int> counts;
    std::string word;
    for (char c : text + " ") {
        bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (letter) {
            word += static_cast<char>(c | 0x20);
        } else if (!word.empty()) {
            ++counts[word];
            word.clear();
        }
    }
    std::string best;
    int most = 0;
    for (const auto& [candidate, count] : counts) {  // alphabetical: the first maximum wins
        if (count > most) {
            best = candidate;
            most = count;
        }
    }
    return best;
}

}  // namespace word_tally
