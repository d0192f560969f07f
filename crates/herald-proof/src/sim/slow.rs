//! The slow provider of the adversarial drill: it answers close to the
//! caller's timeout, sometimes after it, and sometimes executes and then
//! drops the connection. Each call's plan is drawn from fixed shares, so a
//! run's mix is known; the ledger counts the calls whose answer may not have
//! reached the caller ([`Ambiguity`]).

use std::time::Duration;

/// Shares of the plans, in draw order: prompt, near the timeout, after it,
/// executed then dropped.
const SHARES: [f64; 4] = [0.6, 0.2, 0.1, 0.1];
/// "Near the timeout": this range of the caller's timeout, in time.
const NEAR: (f64, f64) = (0.5, 0.85);
/// "After the timeout": this range of it, too late.
const LATE: (f64, f64) = (1.1, 1.5);

/// How one call is served: wait `before`, execute, wait `after`, then answer
/// — or cut the connection instead of answering.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    pub before: Duration,
    pub after: Duration,
    pub drop_connection: bool,
}

impl Plan {
    pub const PROMPT: Plan = Plan { before: Duration::ZERO, after: Duration::ZERO, drop_connection: false };

    pub fn total(&self) -> Duration {
        self.before + self.after
    }
}

/// Why a call's answer may not have reached the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ambiguity {
    /// The answer was ready only after the caller's timeout.
    Late,
    /// The simulator executed, then cut the connection.
    Dropped,
    /// The caller hung up before the answer was ready.
    CallerGone,
}

impl Ambiguity {
    pub fn as_str(self) -> &'static str {
        match self {
            Ambiguity::Late => "late",
            Ambiguity::Dropped => "dropped",
            Ambiguity::CallerGone => "caller_gone",
        }
    }
}

/// Slowness around a caller's timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slowness {
    /// The caller's call timeout, which the delays are measured against.
    pub call_timeout: Duration,
}

impl Slowness {
    /// The plan for one call. `pick`, `scale` and `split` are uniform draws
    /// in [0, 1): `pick` chooses the kind, `scale` the delay within its
    /// range, `split` how much of the delay comes before the execution.
    pub fn plan(&self, pick: f64, scale: f64, split: f64) -> Plan {
        let within = |(lo, hi): (f64, f64)| self.call_timeout.mul_f64(lo + (hi - lo) * scale.clamp(0.0, 1.0));
        let delayed = |delay: Duration| {
            let before = delay.mul_f64(split.clamp(0.0, 1.0));
            Plan { before, after: delay - before, drop_connection: false }
        };
        let [prompt, near, late, _dropped] = SHARES;
        if pick < prompt {
            Plan::PROMPT
        } else if pick < prompt + near {
            delayed(within(NEAR))
        } else if pick < prompt + near + late {
            delayed(within(LATE))
        } else {
            Plan { before: Duration::ZERO, after: Duration::ZERO, drop_connection: true }
        }
    }

    /// Whether an answer ready `elapsed` after the request arrived may have
    /// missed the caller's timeout. Planned delays stay a margin below it;
    /// anything slower (a busy machine) counts as late, so the count never
    /// misses an answer the caller gave up on.
    pub fn late(&self, elapsed: Duration) -> bool {
        elapsed >= self.call_timeout.mul_f64(0.95)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLOW: Slowness = Slowness { call_timeout: Duration::from_secs(2) };

    #[test]
    fn plans_follow_the_shares() {
        assert_eq!(SLOW.plan(0.0, 0.5, 0.5), Plan::PROMPT);
        assert_eq!(SLOW.plan(0.59, 0.9, 0.9), Plan::PROMPT);
        let near = SLOW.plan(0.7, 1.0, 0.5);
        assert_eq!(near.total(), Duration::from_millis(1700), "the top of the near range");
        assert_eq!(near.before, Duration::from_millis(850));
        assert!(!SLOW.late(near.total()), "a near answer is in time");
        let late = SLOW.plan(0.85, 0.0, 0.0);
        assert_eq!((late.before, late.after), (Duration::ZERO, Duration::from_millis(2200)), "executed at once, answered late");
        assert!(SLOW.late(late.total()));
        assert!(SLOW.plan(0.95, 0.0, 0.0).drop_connection);
        assert!(SLOW.plan(0.999, 1.0, 1.0).drop_connection);
    }

    #[test]
    fn draws_out_of_range_are_clamped() {
        let plan = SLOW.plan(0.7, 7.0, -1.0);
        assert_eq!((plan.before, plan.after), (Duration::ZERO, Duration::from_millis(1700)));
    }

    #[test]
    fn a_slow_machine_is_late_too() {
        assert!(!SLOW.late(Duration::from_millis(1899)));
        assert!(SLOW.late(Duration::from_millis(1900)));
    }
}
