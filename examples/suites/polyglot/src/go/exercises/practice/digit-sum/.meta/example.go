package digitsum

import "errors"

// DigitSum returns the sum of the decimal digits of n, or an error when n is negative.
func DigitSum(n int) (int, error) {
	if n < 0 {
		return 0, errors.New("negative number")
	}
	sum := 0
	for ; n > 0; n /= 10 {
		sum += n % 10
	}
	return sum, nil
}
