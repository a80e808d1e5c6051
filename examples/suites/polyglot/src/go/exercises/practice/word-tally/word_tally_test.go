package wordtally

import "testing"

func TestMostCommon(t *testing.T) {
	for _, tc := range []struct {
		name, text, want string
	}{
		{"empty text", "", ""},
		{"no letters", "42 - 7!", ""},
		{"case is ignored", "Go go GO stop", "go"},
		{"punctuation separates words", "red,blue;red.", "red"},
		{"ties go to the first alphabetically", "pear apple pear apple", "apple"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := MostCommon(tc.text); got != tc.want {
				t.Fatalf("MostCommon(%q) = %q, want %q", tc.text, got, tc.want)
			}
		})
	}
}
