use digit_sum::digit_sum;

#[test]
fn zero() {
    assert_eq!(digit_sum(0), Some(0));
}

#[test]
#[ignore]
fn several_digits() {
    assert_eq!(digit_sum(1907), Some(17));
}

#[test]
#[ignore]
fn largest_number() {
    assert_eq!(digit_sum(i64::MAX), Some(88));
}

#[test]
#[ignore]
fn negative_has_no_digit_sum() {
    assert_eq!(digit_sum(-5), None);
}
