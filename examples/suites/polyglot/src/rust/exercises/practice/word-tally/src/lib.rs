/// The most frequent word of `text`, in lower case; `None` when it has no word.
pub fn most_common(text: &str) -> Option<String> {
    todo!("the most common word of {text:?}")
}
