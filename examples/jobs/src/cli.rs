//! Pieces the binaries' command lines share.

use std::str::FromStr;

/// Parses `text` as a `T` that `accept` takes, or says what was expected
/// (`expected` names the accepted range): a `clap` value parser's body.
///
/// ```
/// use pipetransformer_jobs::cli::parse_accepted;
/// let lr = |t: &str| parse_accepted(t, |v: f64| v > 0.0 && v <= 1.0, "a number in (0, 1]");
/// assert_eq!(lr("0.5"), Ok(0.5));
/// assert_eq!(lr("nan").unwrap_err(), "expected a number in (0, 1], got nan");
/// ```
pub fn parse_accepted<T: FromStr + Copy>(
    text: &str,
    accept: impl Fn(T) -> bool,
    expected: &str,
) -> Result<T, String> {
    match text.parse::<T>() {
        Ok(value) if accept(value) => Ok(value),
        _ => Err(format!("expected {expected}, got {text}")),
    }
}

/// A learning rate in (0, 1]: the value parser of `train --lr` and
/// `bench select-task --lr`.
///
/// ```
/// use pipetransformer_jobs::cli::learning_rate;
/// assert_eq!(learning_rate("1e-4"), Ok(1e-4));
/// assert_eq!(learning_rate("0").unwrap_err(), "expected a learning rate in (0, 1], got 0");
/// ```
pub fn learning_rate(text: &str) -> Result<f64, String> {
    parse_accepted(
        text,
        |lr: f64| lr > 0.0 && lr <= 1.0,
        "a learning rate in (0, 1]",
    )
}
