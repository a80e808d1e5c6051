package wordtally

import "strings"

// MostCommon returns the most frequent word of text in lower case ("" when there is none).
func MostCommon(text string) string {
	counts := map[string]int{}
	words := strings.FieldsFunc(strings.ToLower(text), func(r rune) bool {
		return r < 'a' || r > 'z'
	})
	best := ""
	for _, word := range words {
		counts[word]++
	}
	for word, count := range counts {
		if count > counts[best] || (count == counts[best] && word < best) {
			best = word
		}
	}
	return best
}
