//! Whether a subscription keeps per-key order past a dead letter.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// What happens to the records of a key after one of its records was
/// dead-lettered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Order {
    /// They are applied as they come: the dead letter is the only record of
    /// its key applied late (after its redrive). For handlers that do not
    /// care in which order a key's events arrive (version-ordered upserts,
    /// commutative counters, effects keyed per event).
    #[default]
    None,
    /// They are parked behind the letter, durably and in order, and applied
    /// when it is redriven or discarded; other keys flow on. For handlers
    /// that need a key's events in offset order.
    PerKey,
}

impl Order {
    pub fn as_str(self) -> &'static str {
        match self {
            Order::None => "none",
            Order::PerKey => "per-key",
        }
    }
}

impl fmt::Display for Order {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An ordering that is neither `per-key` nor `none`.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("unknown order `{0}`: expected `per-key` or `none`")]
pub struct UnknownOrder(pub String);

impl FromStr for Order {
    type Err = UnknownOrder;

    fn from_str(s: &str) -> Result<Order, UnknownOrder> {
        match s {
            "none" => Ok(Order::None),
            "per-key" => Ok(Order::PerKey),
            other => Err(UnknownOrder(other.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_it_prints() {
        for order in [Order::None, Order::PerKey] {
            assert_eq!(order.to_string().parse::<Order>(), Ok(order));
        }
        assert_eq!("perkey".parse::<Order>(), Err(UnknownOrder("perkey".into())));
        assert_eq!(Order::default(), Order::None);
    }
}
