package digitsum

// DigitSum returns the sum of the decimal digits of n, or an error when n is negative.
func DigitSum(n int) (int, error) {
	panic("Please implement the DigitSum function")
}
