//! Bursts of link notifications handled together: a pod's veth pair comes with a dozen
//! notifications (created, addressed, moved, up), and a node churning a thousand
//! interfaces sends thousands. The first after a quiet spell is handled at once (a new
//! pod's namespace enters the scope before its first connect); those that follow within
//! the spacing wait for its end, and are then handled once, together. For the scope, a
//! burst's second handling comes after a short follow-up instead: the first notification
//! of a pod's setup is often not the one naming its namespace (the bridge the first pod
//! creates, the veth before it moves), and the pod may connect milliseconds later.

use std::time::{Duration, Instant};

/// When a work driven by notifications is next due.
#[derive(Debug)]
pub(crate) struct Coalesce {
    spacing: Duration,
    /// How soon after a burst's first handling the next is due (at most `spacing`).
    follow_up: Duration,
    last: Option<Instant>,
    due: Option<Instant>,
    /// The last handling was the first of a burst: the next change is due after
    /// `follow_up`, not `spacing`.
    burst_began: bool,
}

impl Coalesce {
    /// Handled at most once per `spacing`.
    pub(crate) const fn new(spacing: Duration) -> Self {
        Self::with_follow_up(spacing, spacing)
    }

    /// Handled at most once per `spacing`, except that a burst's second handling comes
    /// `follow_up` after its first: a pod's CNI setup sends a first notification (its
    /// bridge, the veth before it moves) and the one naming the pod's namespace a few
    /// milliseconds later, before the pod's first connect.
    pub(crate) const fn with_follow_up(spacing: Duration, follow_up: Duration) -> Self {
        Self {
            spacing,
            follow_up,
            last: None,
            due: None,
            burst_began: false,
        }
    }

    /// A notification came at `now`.
    pub(crate) fn changed(&mut self, now: Instant) {
        if self.due.is_none() {
            self.due = Some(match self.last {
                Some(last) if now < last + self.spacing => {
                    let wait = if self.burst_began {
                        self.follow_up
                    } else {
                        self.spacing
                    };
                    (last + wait).max(now)
                }
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
        self.burst_began = self.last.is_none_or(|last| now >= last + self.spacing);
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

    #[test]
    fn a_bursts_second_handling_comes_after_the_follow_up() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut c = Coalesce::with_follow_up(ms(100), ms(10));
        c.changed(t0);
        assert_eq!(c.due(), Some(t0), "after a quiet spell: at once");
        c.done(t0);
        c.changed(t0 + ms(2));
        assert_eq!(c.due(), Some(t0 + ms(10)), "the burst's second: soon");
        c.done(t0 + ms(10));
        c.changed(t0 + ms(12));
        assert_eq!(c.due(), Some(t0 + ms(110)), "then once per spacing");
        c.done(t0 + ms(110));
        c.changed(t0 + ms(500));
        assert_eq!(c.due(), Some(t0 + ms(500)), "quiet again: at once");
        c.done(t0 + ms(500));
        c.changed(t0 + ms(520));
        assert_eq!(c.due(), Some(t0 + ms(520)), "past the follow-up: at once");
    }
}
