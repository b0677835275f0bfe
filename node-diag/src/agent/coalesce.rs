//! Bursts of link notifications handled together: a pod's veth pair comes with a dozen
//! notifications (created, addressed, moved, up), and a node churning a thousand
//! interfaces sends thousands. The first after a quiet spell is handled at once (a new
//! pod's namespace enters the scope before its first connect); those that follow within
//! the spacing wait for its end, and are then handled once, together. For the scope, a
//! burst's second handling comes once the notifications pause instead: the first
//! notification of a pod's setup is often not the one naming its namespace (the bridge
//! the first pod creates, the veth before it moves), the rest follow within milliseconds,
//! and the pod may connect milliseconds after the last.

use std::time::{Duration, Instant};

/// When a work driven by notifications is next due.
#[derive(Debug)]
pub(crate) struct Coalesce {
    spacing: Duration,
    /// A burst's second handling comes once no notification came for this long (at
    /// most `spacing` after its first).
    quiet: Duration,
    last: Option<Instant>,
    due: Option<Instant>,
    /// The last handling was the first of a burst: the next waits for a pause of
    /// `quiet`, not for the spacing's end.
    burst_began: bool,
}

impl Coalesce {
    /// Handled at most once per `spacing`.
    pub(crate) const fn new(spacing: Duration) -> Self {
        Self::with_quiet(spacing, spacing)
    }

    /// Handled at most once per `spacing`, except that a burst's second handling comes
    /// once the notifications paused for `quiet` (see the module's documentation).
    pub(crate) const fn with_quiet(spacing: Duration, quiet: Duration) -> Self {
        Self {
            spacing,
            quiet,
            last: None,
            due: None,
            burst_began: false,
        }
    }

    /// A notification came at `now`.
    pub(crate) fn changed(&mut self, now: Instant) {
        match self.last {
            Some(last) if now < last + self.spacing => {
                if self.burst_began {
                    // Each notification of the burst pushes its second handling back.
                    self.due = Some((now + self.quiet).min(last + self.spacing));
                } else if self.due.is_none() {
                    self.due = Some(last + self.spacing);
                }
            }
            _ => {
                if self.due.is_none() {
                    self.due = Some(now);
                }
            }
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
    fn a_bursts_second_handling_comes_once_the_notifications_pause() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut c = Coalesce::with_quiet(ms(100), ms(10));
        c.changed(t0);
        assert_eq!(c.due(), Some(t0), "after a quiet spell: at once");
        c.done(t0);
        c.changed(t0 + ms(2));
        assert_eq!(
            c.due(),
            Some(t0 + ms(12)),
            "the burst's second: after a pause"
        );
        // A pod's setup goes on for a few more milliseconds: each pushes it back.
        c.changed(t0 + ms(8));
        c.changed(t0 + ms(15));
        assert_eq!(c.due(), Some(t0 + ms(25)), "once the last had its pause");
        c.done(t0 + ms(25));
        c.changed(t0 + ms(27));
        assert_eq!(c.due(), Some(t0 + ms(125)), "then once per spacing");
        c.done(t0 + ms(125));
        c.changed(t0 + ms(500));
        assert_eq!(c.due(), Some(t0 + ms(500)), "quiet again: at once");
        c.done(t0 + ms(500));
        c.changed(t0 + ms(520));
        assert_eq!(
            c.due(),
            Some(t0 + ms(530)),
            "the burst's second, after its pause"
        );
    }

    #[test]
    fn a_burst_that_never_pauses_is_handled_at_the_spacings_end() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut c = Coalesce::with_quiet(ms(100), ms(10));
        c.changed(t0);
        c.done(t0);
        for i in 1..200 {
            c.changed(t0 + ms(i));
        }
        assert_eq!(
            c.due(),
            Some(t0 + ms(100)),
            "no later than the spacing's end"
        );
    }
}
