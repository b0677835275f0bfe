//! Kernel events: decoding ring-buffer records into [`Event`]s (their kinds into
//! [`EventKind`]) and the task that drains the ring buffer as soon as it is readable.

use aya::maps::{MapData, RingBuf};
use node_diag_common::Event;
use tokio::{io::unix::AsyncFd, sync::mpsc};

use super::event::{EventKind, UnknownKind};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum DecodeError {
    #[error("ring buffer record of {got} bytes, expected {want}")]
    Size { got: usize, want: usize },
    #[error(transparent)]
    Kind(#[from] UnknownKind),
}

/// Decodes one ring-buffer record. The kernel writes exactly one [`Event`] per record.
pub(crate) fn decode(bytes: &[u8]) -> Result<(EventKind, Event), DecodeError> {
    let want = size_of::<Event>();
    if bytes.len() < want {
        return Err(DecodeError::Size {
            got: bytes.len(),
            want,
        });
    }
    // SAFETY: length checked; Event is repr(C), integer-only (every bit pattern is valid);
    // read_unaligned tolerates any alignment of the record.
    let ev = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Event>()) };
    Ok((EventKind::try_from(ev.kind)?, ev))
}

/// Events queued between the ring buffer's reader and the agent's loop at most: a node's
/// worst burst so far (20,000 refusals to distinct ports, one event each, while a slow
/// node's loop handles a few thousand a second) with room to spare: 272 bytes an event,
/// about 9 MiB when full (tokio allocates its blocks as they fill). Past it events are
/// dropped and counted as lost: the loop is behind, and the memory of a node under a
/// storm is not the agent's to take.
pub(crate) const QUEUE: usize = 32_768;

/// Drains `ring` into `tx` until the receiver goes away. Undecodable records, and events
/// the full queue turned away, are counted through `lost`.
pub(crate) async fn drain(
    ring: RingBuf<MapData>,
    tx: mpsc::Sender<(EventKind, Event)>,
    lost: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> std::io::Result<()> {
    // SAFETY: the AsyncFd owns the RingBuf, which owns the map fd, so the fd stays open
    // and unchanged for as long as it is registered.
    let mut fd = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }?;
    let mut overflowing = false;
    loop {
        let mut guard = fd.readable_mut().await?;
        let ring = guard.get_inner_mut();
        while let Some(item) = ring.next() {
            match decode(&item) {
                Ok(ev) => match forward(&tx, ev) {
                    Forward::Queued => overflowing = false,
                    Forward::Dropped { lost: n } => {
                        if !overflowing {
                            tracing::warn!(
                                capacity = QUEUE,
                                "kernel event queue full: events dropped and counted as lost until the agent catches up"
                            );
                            overflowing = true;
                        }
                        lost.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                    }
                    Forward::Closed => return Ok(()),
                },
                Err(e) => {
                    tracing::warn!(error = %e, "undecodable ring buffer record");
                    lost.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        guard.clear_ready();
    }
}

/// What became of one event offered to the agent's queue.
#[derive(Debug, PartialEq, Eq)]
enum Forward {
    Queued,
    /// The queue was full; `lost` verdicts are to count as lost now. An aggregated
    /// event's verdicts are not: its key, never seen by the agent, is counted lost whole
    /// when the agent gives it up (`VerdictTracker::read`), and counting it here too
    /// would count it twice.
    Dropped {
        lost: u64,
    },
    /// The agent's loop is gone.
    Closed,
}

fn forward(tx: &mpsc::Sender<(EventKind, Event)>, ev: (EventKind, Event)) -> Forward {
    let aggregated = ev.1.count > 0;
    match tx.try_send(ev) {
        Ok(()) => Forward::Queued,
        Err(mpsc::error::TrySendError::Full(_)) => Forward::Dropped {
            lost: u64::from(!aggregated),
        },
        Err(mpsc::error::TrySendError::Closed(_)) => Forward::Closed,
    }
}

#[cfg(test)]
mod tests {
    use node_diag_common::event_kind;

    use super::*;
    // The one test-event builder; tests may reach up, the code may not.
    use crate::findings::fixtures;

    fn bytes_of(ev: &Event) -> Vec<u8> {
        // SAFETY: Event is plain old data with no padding.
        unsafe { std::slice::from_raw_parts((ev as *const Event).cast::<u8>(), size_of::<Event>()) }
            .to_vec()
    }

    #[test]
    fn round_trips_an_event_even_unaligned() {
        let ev = fixtures::event(event_kind::CONNECT_REFUSED, 111);
        let mut buf = vec![0u8];
        buf.extend(bytes_of(&ev));
        assert_eq!(decode(&buf[1..]).unwrap(), (EventKind::ConnectRefused, ev));
    }

    #[test]
    fn rejects_records_of_unknown_kinds() {
        let ev = fixtures::event(99, 0);
        assert_eq!(
            decode(&bytes_of(&ev)),
            Err(DecodeError::Kind(UnknownKind(99)))
        );
    }

    #[test]
    fn a_full_queue_drops_and_counts_each_unaggregated_event_once() {
        let (tx, mut rx) = mpsc::channel(1);
        let plain = fixtures::event(event_kind::CONNECT_REFUSED, 111);
        let mut aggregated = plain;
        aggregated.count = 7;
        assert_eq!(
            forward(&tx, (EventKind::ConnectRefused, plain)),
            Forward::Queued
        );
        assert_eq!(
            forward(&tx, (EventKind::ConnectRefused, plain)),
            Forward::Dropped { lost: 1 }
        );
        // Its key's seven verdicts are counted when the agent gives the key up.
        assert_eq!(
            forward(&tx, (EventKind::ConnectRefused, aggregated)),
            Forward::Dropped { lost: 0 }
        );
        assert_eq!(rx.try_recv().unwrap().1, plain);
        assert_eq!(
            forward(&tx, (EventKind::ConnectRefused, aggregated)),
            Forward::Queued
        );
        drop(rx);
        assert_eq!(
            forward(&tx, (EventKind::ConnectRefused, plain)),
            Forward::Closed
        );
    }

    #[test]
    fn rejects_short_records() {
        assert_eq!(
            decode(&[0; 10]),
            Err(DecodeError::Size {
                got: 10,
                want: size_of::<Event>()
            })
        );
    }
}
