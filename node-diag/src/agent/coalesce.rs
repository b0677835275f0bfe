//! Bursts of link notifications handled together: a pod's veth pair comes with a dozen
//! notifications (created, addressed, moved, up), and a node churning a thousand
//! interfaces sends thousands. The first after a quiet spell is handled at once (a new
//! pod's namespace enters the scope before its first connect); those that follow within
//! the spacing wait for its end, and are then handled once, together.

use std::time::{Duration, Instant};

/// When a work driven by notifications is next due.
#[derive(Debug)]
pub(crate) struct Coalesce {
    spacing: Duration,
    last: Option<Instant>,
    due: Option<Instant>,
}

impl Coalesce {
    /// Handled at most once per `spacing`.
    pub(crate) const fn new(spacing: Duration) -> Self {
        Self {
            spacing,
            last: None,
            due: None,
        }
    }

    /// A notification came at `now`.
    pub(crate) fn changed(&mut self, now: Instant) {
        if self.due.is_none() {
            self.due = Some(match self.last {
                Some(last) if now < last + self.spacing => last + self.spacing,
                _ => now,
            });
        }
    }

    /// When the work is due, if a notification waits for it.
    pub(crate) fn due(&self) -> Option<Instant> {
        self.due
    }

    /// The work was done at `now` (for whatever reason: a periodic pass counts).
    pub(crate) fn done(&mut self, now: Instant) {
        self.last = Some(now);
        self.due = None;
    }
}

/// Waits until `due`; never without it.
pub(crate) async fn until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_is_at_once_a_burst_once_after_the_spacing() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut c = Coalesce::new(ms(100));
        assert_eq!(c.due(), None);
        c.changed(t0);
        assert_eq!(c.due(), Some(t0), "after a quiet spell: at once");
        c.done(t0);
        for i in 1..50 {
            c.changed(t0 + ms(i));
        }
        assert_eq!(
            c.due(),
            Some(t0 + ms(100)),
            "the burst: once, at the spacing's end"
        );
        c.done(t0 + ms(100));
        assert_eq!(c.due(), None);
        c.changed(t0 + ms(500));
        assert_eq!(c.due(), Some(t0 + ms(500)), "quiet again: at once");
    }
}
