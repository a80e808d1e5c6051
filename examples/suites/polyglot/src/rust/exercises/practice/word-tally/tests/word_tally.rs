use word_tally::most_common;

#[test]
fn empty_text() {
    assert_eq!(most_common(""), None);
}

#[test]
#[ignore]
fn case_is_ignored() {
    assert_eq!(most_common("Go go GO stop").as_deref(), Some("go"));
}

#[test]
#[ignore]
fn punctuation_separates_words() {
    assert_eq!(most_common("red,blue;red.").as_deref(), Some("red"));
}

#[test]
#[ignore]
fn ties_go_to_the_first_alphabetically() {
    assert_eq!(most_common("pear apple pear apple").as_deref(), Some("apple"));
}
