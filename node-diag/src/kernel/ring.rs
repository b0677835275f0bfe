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

/// Drains `ring` into `tx` until the receiver goes away. Undecodable records are counted
/// by the caller through `bad`.
pub(crate) async fn drain(
    ring: RingBuf<MapData>,
    tx: mpsc::UnboundedSender<(EventKind, Event)>,
    bad: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> std::io::Result<()> {
    // SAFETY: the AsyncFd owns the RingBuf, which owns the map fd, so the fd stays open
    // and unchanged for as long as it is registered.
    let mut fd = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }?;
    loop {
        let mut guard = fd.readable_mut().await?;
        let ring = guard.get_inner_mut();
        while let Some(item) = ring.next() {
            match decode(&item) {
                Ok(ev) => {
                    if tx.send(ev).is_err() {
                        return Ok(());
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "undecodable ring buffer record");
                    bad.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        guard.clear_ready();
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
