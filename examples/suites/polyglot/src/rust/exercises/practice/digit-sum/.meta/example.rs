/// The sum of the decimal digits of `n`; `None` when `n` is negative.
pub fn digit_sum(n: i64) -> Option<u32> {
    if n < 0 {
        return None;
    }
    Some(n.to_string().chars().filter_map(|c| c.to_digit(10)).sum())
}
