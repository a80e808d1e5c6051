module wordtally

go 1.18
