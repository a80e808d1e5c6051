package digitsum

import "testing"

func TestDigitSum(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int
		want int
	}{
		{"zero", 0, 0},
		{"single digit", 7, 7},
		{"several digits", 1907, 17},
		{"large number", 999999999, 81},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DigitSum(tc.n)
			if err != nil || got != tc.want {
				t.Fatalf("DigitSum(%d) = %d, %v; want %d, nil", tc.n, got, err, tc.want)
			}
		})
	}
}

func TestNegativeIsAnError(t *testing.T) {
	if _, err := DigitSum(-5); err == nil {
		t.Fatal("DigitSum(-5) returned no error")
	}
}
