use std::collections::BTreeMap;

/// The most frequent word of `text`, in lower case; `None` when it has no word.
pub fn most_common(text: &str) -> Option<String> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for word in text.split(|c: char| !c.is_ascii_alphabetic()) {
        if !word.is_empty() {
            *counts.entry(word.to_ascii_lowercase()).or_default() += 1;
        }
    }
    // BTreeMap iterates alphabetically; max_by_key keeps the last maximum, so go backwards.
    counts.into_iter().rev().max_by_key(|(_, count)| *count).map(|(word, _)| word)
}
