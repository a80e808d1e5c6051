package wordtally

// MostCommon returns the most frequent word of text in lower case ("" when there is none).
func MostCommon(text string) string {
	panic("Please implement the MostCommon function")
}
