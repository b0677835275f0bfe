//! Probing the path of a flow the kernel cannot explain, bounded so that a node full of
//! stalls cannot turn the agent into a flood of pings.
//!
//! A finding asks ([`path::question`]): a stall on full-size segments with no MTU
//! evidence here, or a connect timing out with none. The probe (`crate::probe::path`)
//! runs on a blocking thread and its result comes back on a channel the agent's loop
//! selects on; the verdict is [`path::judge`]'s.
//!
//! Bounds, all in [`Limits`]:
//! - only peers with such a finding are probed, at most once per peer and question per
//!   `window`; findings about the same peer within the window are judged on the last
//!   run's result ([`PathProbes::judge_cached`]) instead, or, while that run is under
//!   way, on its result when it ends (at most [`MAX_WAITING`] of them);
//! - at most `max_running` runs at a time (others wait for the next finding);
//! - every run sends at most `budget` (≤ 20) echo requests, and all runs together at
//!   most `per_second` a second ([`Pacer`]).
//!
//! A black hole a run found stays open until a run shows the path healed: its peer is
//! probed again once per `window` ([`PathProbes::reprobe`]), within the same bounds.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::{
    findings::{
        Finding,
        correlate::path::{self, PathCheck, PathVerdict, Question},
    },
    probe::path::{MAX_PACKETS, PathRequest, check},
};

/// Findings kept per run under way, to judge on its result: a connect's timeout and
/// then its failure, a few flows to one peer stalling together.
pub(crate) const MAX_WAITING: usize = 8;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) window: Duration,
    pub(crate) max_running: usize,
    pub(crate) per_second: u32,
    pub(crate) budget: u32,
    /// Bound on each wait for an echo reply.
    pub(crate) timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(60),
            max_running: 2,
            per_second: 50,
            budget: MAX_PACKETS,
            // A stall is reported after ~1.5 s of retransmits; a run of 20 packets,
            // most of them answered in a millisecond and the lost ones waited for
            // 250 ms (10× the slowest answer, at least 250 ms), ends well within
            // the 15 s a black hole must be reported in.
            timeout: Duration::from_millis(1000),
        }
    }
}

/// Which runs may start: one per peer and question per window, a few at a time. Pure
/// bookkeeping, tested without probing.
#[derive(Debug, Default)]
struct Admission {
    started: HashMap<(IpAddr, Question), Instant>,
    running: usize,
}

impl Admission {
    fn admit(&mut self, key: (IpAddr, Question), now: Instant, limits: &Limits) -> bool {
        if self.running >= limits.max_running {
            return false;
        }
        if let Some(t) = self.started.get(&key)
            && now.duration_since(*t) < limits.window
        {
            return false;
        }
        // Forget peers whose window is over, so the map stays as small as the trouble.
        self.started
            .retain(|_, t| now.duration_since(*t) < limits.window);
        self.started.insert(key, now);
        self.running += 1;
        true
    }

    fn finished(&mut self) {
        self.running = self.running.saturating_sub(1);
    }
}

/// Spaces echo requests of every run at least `1 / per_second` apart.
#[derive(Debug)]
pub(crate) struct Pacer {
    gap: Duration,
    next: Mutex<Option<Instant>>,
}

impl Pacer {
    pub(crate) fn new(per_second: u32) -> Self {
        Self {
            gap: Duration::from_secs(1) / per_second.max(1),
            next: Mutex::new(None),
        }
    }

    /// Takes the next slot at or after `now`; returns how long to wait for it.
    fn reserve(&self, now: Instant) -> Duration {
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let slot = next.map_or(now, |n| n.max(now));
        *next = Some(slot + self.gap);
        slot - now
    }

    /// Blocks until this thread may send.
    pub(crate) fn wait(&self) {
        let d = self.reserve(Instant::now());
        if !d.is_zero() {
            std::thread::sleep(d);
        }
    }
}

/// A run's end: the finding that asked, and what the path showed.
pub(crate) struct Done {
    original: Finding,
    question: Question,
    peer: IpAddr,
    check: Result<PathCheck, String>,
}

pub(crate) struct PathProbes {
    limits: Limits,
    admission: Admission,
    pacer: Arc<Pacer>,
    /// The last run's result per peer and question, with when it ended.
    results: HashMap<(IpAddr, Question), (Instant, PathCheck)>,
    /// The runs under way, and the findings that asked the same while they ran.
    waiting: HashMap<(IpAddr, Question), Vec<Finding>>,
    tx: mpsc::UnboundedSender<Done>,
    rx: mpsc::UnboundedReceiver<Done>,
}

/// The address the flow's packets go to: a Service's backend, else the destination.
fn peer_of(f: &Finding) -> Option<IpAddr> {
    f.backend.or(f.dst)
}

impl PathProbes {
    pub(crate) fn new(limits: Limits) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            pacer: Arc::new(Pacer::new(limits.per_second)),
            limits,
            admission: Admission::default(),
            results: HashMap::new(),
            waiting: HashMap::new(),
            tx,
            rx,
        }
    }

    /// A finding judged on a run of this window about the same peer, when there was
    /// one; otherwise the finding unchanged, and a run started for it when it asks and
    /// the bounds allow.
    pub(crate) fn judge_cached(&mut self, f: Finding) -> Finding {
        let (Some(question), Some(peer)) = (path::question(&f), peer_of(&f)) else {
            return f;
        };
        let now = Instant::now();
        let key = (peer, question);
        if let Some((at, check)) = self.results.get(&key)
            && now.duration_since(*at) < self.limits.window
        {
            let count = f.count;
            let mut judged = match path::judge(&f, check, SystemTime::now()) {
                PathVerdict::Replace(g) | PathVerdict::Annotate(g) | PathVerdict::Healed(g) => g,
            };
            judged.count = count;
            return judged;
        }
        if self.admission.admit(key, now, &self.limits) {
            self.waiting.insert(key, Vec::new());
            self.start(f.clone(), question, peer);
        } else if let Some(waiting) = self.waiting.get_mut(&key)
            && waiting.len() < MAX_WAITING
        {
            waiting.push(f.clone());
        } else {
            debug!(%peer, ?question, "path probe not started: bounds");
        }
        f
    }

    /// Probes again the path of `hole`, a black hole a probe found, once its peer's
    /// window is over: the same bounds as a first run, so a path black hole costs one
    /// run per window while it stays open.
    pub(crate) fn reprobe(&mut self, hole: &Finding) {
        let Some(peer) = peer_of(hole) else {
            return;
        };
        if self
            .admission
            .admit((peer, Question::Size), Instant::now(), &self.limits)
        {
            self.start(hole.clone(), Question::Size, peer);
        }
    }

    fn start(&self, original: Finding, question: Question, peer: IpAddr) {
        let req = PathRequest {
            dst: peer,
            question,
            budget: self.limits.budget,
            timeout: self.limits.timeout,
        };
        let pacer = self.pacer.clone();
        let tx = self.tx.clone();
        debug!(%peer, ?question, "path probe started");
        tokio::task::spawn_blocking(move || {
            let check = check(&req, || pacer.wait()).map_err(|e| e.to_string());
            let _ = tx.send(Done {
                original,
                question,
                peer,
                check,
            });
        });
    }

    /// The next run to end. Cancel-safe (a channel receive), for `select!`.
    pub(crate) async fn next(&mut self) -> Done {
        match self.rx.recv().await {
            Some(done) => done,
            // `self` holds a sender: the channel never closes.
            None => std::future::pending().await,
        }
    }

    /// What a run that ended makes of the finding that asked, and of those that asked
    /// the same while it ran: each with the finding to record, and whether it replaces
    /// the one that asked (to withdraw).
    pub(crate) fn verdicts(&mut self, done: Done) -> Vec<(Finding, PathVerdict)> {
        self.admission.finished();
        let key = (done.peer, done.question);
        let waiting = self.waiting.remove(&key).unwrap_or_default();
        let check = match done.check {
            Ok(check) => check,
            Err(e) => {
                warn!(peer = %done.peer, error = %e, "path probe failed");
                return Vec::new();
            }
        };
        self.results
            .retain(|_, (at, _)| at.elapsed() < self.limits.window);
        self.results.insert(key, (Instant::now(), check.clone()));
        let now = SystemTime::now();
        std::iter::once(done.original)
            .chain(waiting)
            .map(|f| {
                let verdict = path::judge(&f, &check, now);
                (f, verdict)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 244, 2, 9));
    const OTHER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 244, 3, 9));

    fn limits() -> Limits {
        Limits {
            window: Duration::from_secs(60),
            max_running: 2,
            ..Limits::default()
        }
    }

    #[test]
    fn one_run_per_peer_and_question_per_window() {
        let (mut a, l, t0) = (Admission::default(), limits(), Instant::now());
        assert!(a.admit((PEER, Question::Size), t0, &l));
        a.finished();
        assert!(!a.admit((PEER, Question::Size), t0 + Duration::from_secs(59), &l));
        assert!(
            a.admit((PEER, Question::Tunnel), t0, &l),
            "another question"
        );
        a.finished();
        assert!(a.admit((PEER, Question::Size), t0 + Duration::from_secs(60), &l));
        a.finished();
        assert_eq!(a.running, 0);
    }

    #[test]
    fn at_most_max_running_at_a_time() {
        let (mut a, l, t0) = (Admission::default(), limits(), Instant::now());
        assert!(a.admit((PEER, Question::Size), t0, &l));
        assert!(a.admit((OTHER, Question::Size), t0, &l));
        let third = IpAddr::V4(std::net::Ipv4Addr::new(10, 244, 4, 9));
        assert!(!a.admit((third, Question::Size), t0, &l), "cap");
        a.finished();
        assert!(a.admit((third, Question::Size), t0, &l));
        // A refused run does not take the peer's window.
        a.finished();
        a.finished();
        assert_eq!(a.running, 0);
    }

    #[test]
    fn the_pacer_spaces_every_packet() {
        let p = Pacer::new(50);
        let t0 = Instant::now();
        let waits: Vec<Duration> = (0..5).map(|_| p.reserve(t0)).collect();
        assert_eq!(
            waits,
            (0..5)
                .map(|i| Duration::from_millis(20) * i)
                .collect::<Vec<_>>()
        );
        // After a pause the budget does not accumulate into a burst.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(p.reserve(later), Duration::ZERO);
        assert_eq!(p.reserve(later), Duration::from_millis(20));
    }

    #[test]
    fn the_default_run_fits_its_bounds() {
        let l = Limits::default();
        assert!(l.budget <= 20);
        assert!(l.per_second > 0 && l.max_running > 0);
    }
}
