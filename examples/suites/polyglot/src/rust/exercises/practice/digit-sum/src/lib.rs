/// The sum of the decimal digits of `n`; `None` when `n` is negative.
pub fn digit_sum(n: i64) -> Option<u32> {
    todo!("the digit sum of {n}")
}
