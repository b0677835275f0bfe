//! The path MTU search, over an abstract probe function: which sizes to try in which
//! order, and what their [`Outcome`]s add up to. Pure, so it is tested without sockets;
//! `icmp` supplies the real probe function.

use std::net::IpAddr;

use super::packets::Outcome;

/// A frag-needed (packet too big) message a probe drew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FragNeeded {
    /// Size of the probe it refused.
    pub(crate) size: u32,
    pub(crate) next_hop_mtu: Option<u32>,
    pub(crate) from: IpAddr,
}

/// What the binary search found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Search {
    /// Largest size that got an echo reply; `None` when even the smallest did not.
    pub(crate) path_mtu: Option<u32>,
    pub(crate) frag_needed: Vec<FragNeeded>,
    /// Sizes that drew nothing, twice (ascending).
    pub(crate) vanished: Vec<u32>,
    /// Sizes the local interface refused (`EMSGSIZE`).
    pub(crate) local_too_big: Vec<u32>,
    /// A non-MTU destination-unreachable that a probe drew: `(size, code, from)`.
    pub(crate) unreachable: Option<(u32, u8, IpAddr)>,
    /// Echo requests sent (retries included).
    pub(crate) probes: u32,
    /// The smallest size that did not fit (vanished, refused, too big here), when one
    /// was tried.
    pub(crate) smallest_lost: Option<u32>,
    /// The packet budget ran out before the search converged: `path_mtu` and
    /// `smallest_lost` bracket the path MTU instead of naming it.
    pub(crate) exhausted: bool,
}

/// Finds the largest size in `min..=max` that `probe` reports as fitting.
///
/// `min` goes first, to tell "the destination does not answer at all" from MTU trouble;
/// then `max`, the common case where the whole local MTU fits. After that it bisects
/// between the largest size that fitted and the smallest that did not, except that a
/// frag-needed naming a next-hop MTU is tried at once (and then that MTU + 1), so a
/// working PMTUD path converges in four probes. A size that draws nothing is retried
/// once before it counts as vanished, so one lost packet is not a black hole.
pub(crate) fn search<E>(
    min: u32,
    max: u32,
    probe: impl FnMut(u32) -> Result<Outcome, E>,
) -> Result<Search, E> {
    search_bounded(min, max, u32::MAX, probe)
}

/// [`search`] sending at most `budget` echo requests. When the budget runs out first,
/// the search stops with what it has (`exhausted`): the largest size that fitted and the
/// smallest that did not. A silence the budget leaves no retry for counts as lost.
pub(crate) fn search_bounded<E>(
    min: u32,
    max: u32,
    budget: u32,
    mut probe: impl FnMut(u32) -> Result<Outcome, E>,
) -> Result<Search, E> {
    let mut s = Search::default();
    let mut attempt = |s: &mut Search, size: u32| -> Result<Option<Outcome>, E> {
        if s.probes >= budget {
            s.exhausted = true;
            return Ok(None);
        }
        s.probes += 1;
        let outcome = probe(size)?;
        if outcome != Outcome::Lost || s.probes >= budget {
            return Ok(Some(outcome));
        }
        s.probes += 1;
        probe(size).map(Some)
    };

    let Some(first) = attempt(&mut s, min)? else {
        return Ok(s);
    };
    match first {
        Outcome::Reply => {}
        Outcome::Unreachable { code, from } => {
            s.unreachable = Some((min, code, from));
            return Ok(s);
        }
        Outcome::FragNeeded { next_hop_mtu, from } => {
            s.frag_needed.push(FragNeeded {
                size: min,
                next_hop_mtu,
                from,
            });
            return Ok(s);
        }
        Outcome::LocalTooBig => {
            s.local_too_big.push(min);
            return Ok(s);
        }
        // Not evidence of a black hole: nothing answers at any size.
        Outcome::Lost => return Ok(s),
    }

    // Invariant: `lo` fits, `hi` does not (max + 1 stands for "beyond the range").
    let mut lo = min;
    let mut hi = max.max(min) + 1;
    let mut next = Some((max, false));
    loop {
        let (size, hinted) = match next.take() {
            Some(n) if n.0 > lo && n.0 < hi => n,
            _ if hi - lo <= 1 => break,
            _ => (lo + (hi - lo) / 2, false),
        };
        let Some(outcome) = attempt(&mut s, size)? else {
            break;
        };
        match outcome {
            Outcome::Reply => {
                lo = size;
                // A router's claim that held: one size up shows whether it was exact.
                if hinted {
                    next = Some((size + 1, false));
                }
            }
            Outcome::FragNeeded { next_hop_mtu, from } => {
                hi = size;
                s.frag_needed.push(FragNeeded {
                    size,
                    next_hop_mtu,
                    from,
                });
                next = next_hop_mtu.map(|m| (m, true));
            }
            Outcome::Unreachable { code, from } => {
                hi = size;
                s.unreachable.get_or_insert((size, code, from));
            }
            Outcome::LocalTooBig => {
                hi = size;
                s.local_too_big.push(size);
            }
            Outcome::Lost => {
                hi = size;
                s.vanished.push(size);
            }
        }
    }
    s.vanished.sort_unstable();
    s.path_mtu = Some(lo);
    s.smallest_lost = (hi <= max).then_some(hi);
    Ok(s)
}

#[cfg(test)]
pub(super) mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    pub(crate) const ROUTER: IpAddr = IpAddr::V4(Ipv4Addr::new(169, 254, 1, 1));

    /// A path of `pmtu` behind a local interface of `local`; oversized probes draw
    /// frag-needed (with the MTU) unless `blackhole`.
    pub(crate) fn path(
        local: u32,
        pmtu: u32,
        blackhole: bool,
    ) -> impl FnMut(u32) -> Result<Outcome, ()> {
        move |size| {
            Ok(if size > local {
                Outcome::LocalTooBig
            } else if size <= pmtu {
                Outcome::Reply
            } else if blackhole {
                Outcome::Lost
            } else {
                Outcome::FragNeeded {
                    next_hop_mtu: Some(pmtu),
                    from: ROUTER,
                }
            })
        }
    }

    #[test]
    fn whole_local_mtu_fits_in_two_probes() {
        let s = search(68, 1500, path(1500, 1500, false)).unwrap();
        assert_eq!(s.path_mtu, Some(1500));
        assert_eq!(s.probes, 2);
        assert!(s.vanished.is_empty() && s.frag_needed.is_empty());
    }

    #[test]
    fn frag_needed_hint_converges_fast() {
        let s = search(68, 1500, path(1500, 1450, false)).unwrap();
        assert_eq!(s.path_mtu, Some(1450));
        // 68, 1500 (frag-needed 1450), 1450 (fits), 1451 (frag-needed).
        assert_eq!(s.probes, 4);
        assert_eq!(s.frag_needed.len(), 2);
        assert_eq!(s.frag_needed[0].next_hop_mtu, Some(1450));
        assert!(s.vanished.is_empty());
    }

    #[test]
    fn blackhole_bisects_and_retries_each_silence_once() {
        let mut sent = Vec::new();
        let mut net = path(1500, 1450, true);
        let s = search(68, 1500, |size| {
            sent.push(size);
            net(size)
        })
        .unwrap();
        assert_eq!(s.path_mtu, Some(1450));
        assert!(s.frag_needed.is_empty());
        assert_eq!(s.vanished.first(), Some(&1451));
        assert_eq!(s.vanished.last(), Some(&1500));
        for v in &s.vanished {
            assert_eq!(
                sent.iter().filter(|x| *x == v).count(),
                2,
                "{v} retried once"
            );
        }
        assert_eq!(s.probes as usize, sent.len());
    }

    #[test]
    fn finds_every_path_mtu() {
        for pmtu in 68..=1500 {
            for blackhole in [false, true] {
                let s = search(68, 1500, path(1500, pmtu, blackhole)).unwrap();
                assert_eq!(s.path_mtu, Some(pmtu), "pmtu {pmtu} blackhole {blackhole}");
                assert_eq!(s.vanished.is_empty(), !blackhole || pmtu == 1500);
            }
        }
    }

    #[test]
    fn one_lost_packet_is_not_a_black_hole() {
        let mut lost_once = false;
        let s = search(68, 1500, |size| {
            Ok::<_, ()>(if size == 1500 && !lost_once {
                lost_once = true;
                Outcome::Lost
            } else {
                Outcome::Reply
            })
        })
        .unwrap();
        assert_eq!(s.path_mtu, Some(1500));
        assert!(s.vanished.is_empty());
        assert_eq!(s.probes, 3);
    }

    #[test]
    fn bogus_hints_and_local_limits_are_survived() {
        // A router claiming an MTU above the probe, or below what already fitted.
        for hint in [Some(9000), Some(100), Some(68), None] {
            let s = search(68, 1500, |size| {
                Ok::<_, ()>(if size <= 1400 {
                    Outcome::Reply
                } else {
                    Outcome::FragNeeded {
                        next_hop_mtu: hint,
                        from: ROUTER,
                    }
                })
            })
            .unwrap();
            assert_eq!(s.path_mtu, Some(1400), "hint {hint:?}");
        }
        // The ceiling above the interface: EMSGSIZE bounds the search.
        let s = search(68, 9000, path(1500, 1500, false)).unwrap();
        assert_eq!(s.path_mtu, Some(1500));
        assert!(!s.local_too_big.is_empty());
    }

    #[test]
    fn a_budget_brackets_the_path_mtu() {
        for budget in [1, 2, 3, 5, 8, 13, 20] {
            let mut sent = 0;
            let mut net = path(1450, 1350, true);
            let s = search_bounded(68, 1450, budget, |size| {
                sent += 1;
                net(size)
            })
            .unwrap();
            assert!(sent <= budget, "budget {budget}: sent {sent}");
            assert_eq!(s.probes, sent);
            if budget >= 3 {
                let (ok, lost) = (s.path_mtu.unwrap(), s.smallest_lost.unwrap());
                assert!(ok <= 1350 && lost > 1350 && ok < lost, "{budget}: {s:?}");
            }
        }
        let s = search_bounded(68, 1450, 8, path(1450, 1350, true)).unwrap();
        assert!(s.exhausted);
        let s = search_bounded(68, 1450, 20, path(1450, 1350, true)).unwrap();
        assert_eq!((s.path_mtu, s.smallest_lost), (Some(1350), Some(1351)));
        let s = search(68, 1450, path(1450, 1350, true)).unwrap();
        assert_eq!((s.path_mtu, s.smallest_lost), (Some(1350), Some(1351)));
        assert!(!s.exhausted);
        let s = search(68, 1500, path(1500, 1500, false)).unwrap();
        assert_eq!(s.smallest_lost, None);
    }

    #[test]
    fn silence_at_the_smallest_size_is_no_reply() {
        let s = search(68, 1500, |_| Ok::<_, ()>(Outcome::Lost)).unwrap();
        assert_eq!(s.path_mtu, None);
        assert!(s.vanished.is_empty());
        assert_eq!(s.probes, 2);
        let s = search(68, 1500, |_| {
            Ok::<_, ()>(Outcome::Unreachable {
                code: 1,
                from: ROUTER,
            })
        })
        .unwrap();
        assert_eq!((s.path_mtu, s.unreachable), (None, Some((68, 1, ROUTER))));
        assert_eq!(search(68, 1500, |_| Err::<Outcome, _>("boom")), Err("boom"));
    }
}
